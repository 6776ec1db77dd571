'use strict';

// Drives stripe-node against a Caddy site, for sdk_node_test.go.
//
//   node run.js <base URL> < cases.json
//
// cases.json: {"maxNetworkRetries": n, "cases": [case, ...]}, where a case is
// {"name", "account", "key", "params", "background", "awaitBackground",
// "pauseMs"}: a paymentIntents.create call with the Stripe-Account and
// Idempotency-Key given. A background call is not awaited before the next
// case starts; awaitBackground waits for every background call before this
// one starts; pauseMs waits after starting the case. Prints one JSON array, a result per
// case, in the order of the cases:
// {"name", "attempts", "ok", "object": {...}, "replayed", "error": {...}}.

const Stripe = require('stripe');

function readStdin() {
  return new Promise((resolve, reject) => {
    let data = '';
    process.stdin.setEncoding('utf8');
    process.stdin.on('data', (chunk) => (data += chunk));
    process.stdin.on('end', () => resolve(data));
    process.stdin.on('error', reject);
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const base = new URL(process.argv[2]);
  const input = JSON.parse(await readStdin());
  const stripe = new Stripe('sk_test_caddy_redis_lock', {
    host: base.hostname,
    port: base.port,
    protocol: base.protocol.replace(':', ''),
    maxNetworkRetries: input.maxNetworkRetries,
    telemetry: false,
  });

  // Every attempt the SDK makes, retries included, by idempotency key.
  const attempts = new Map();
  stripe.on('request', (ev) => {
    attempts.set(ev.idempotency_key, (attempts.get(ev.idempotency_key) || 0) + 1);
  });

  const run = async (c) => {
    const before = attempts.get(c.key) || 0;
    const out = { name: c.name };
    try {
      const pi = await stripe.paymentIntents.create(c.params, {
        stripeAccount: c.account,
        idempotencyKey: c.key,
      });
      const headers = pi.lastResponse.headers;
      out.ok = true;
      out.status = pi.lastResponse.statusCode;
      out.object = { ...pi };
      out.replayed = headers['idempotent-replayed'] === 'true';
    } catch (e) {
      out.ok = false;
      out.error = {
        class: e.type,
        rawType: e.rawType || '',
        code: e.code || '',
        message: e.message || '',
        declineCode: e.decline_code || '',
        charge: e.charge || '',
        statusCode: e.statusCode || 0,
        replayed: !!(e.headers && e.headers['idempotent-replayed'] === 'true'),
        shouldRetry: (e.headers && e.headers['stripe-should-retry']) || '',
      };
    }
    out.attempts = (attempts.get(c.key) || 0) - before;
    return out;
  };

  const results = new Array(input.cases.length);
  const background = [];
  for (const [i, c] of input.cases.entries()) {
    if (c.awaitBackground) {
      await Promise.all(background);
    }
    const p = run(c).then((r) => (results[i] = r));
    if (c.background) {
      background.push(p);
    } else {
      await p;
    }
    if (c.pauseMs) {
      await sleep(c.pauseMs);
    }
  }
  await Promise.all(background);
  // Exit once written: the SDK's idle keep-alive sockets would hold the
  // process until they time out.
  process.stdout.write(JSON.stringify(results) + '\n', () => process.exit(0));
}

main().catch((e) => {
  process.stderr.write(String((e && e.stack) || e) + '\n');
  process.exit(1);
});
