package redistest

import (
	"crypto/x509"
	"errors"
	"os"
	"testing"
	"time"
)

func TestTLS(t *testing.T) {
	t.Parallel()
	s := StartTLS(t)
	ctx := Context(t, 30*time.Second)
	for _, f := range []string{s.CAFile, s.CertFile, s.KeyFile, s.PKI.ServerCertFile, s.PKI.UntrustedCAFile} {
		if _, err := os.Stat(f); err != nil {
			t.Fatal(err)
		}
	}

	if got, err := Do(ctx, s.Addr, s.ClientConfig(), "PING"); err != nil || got != "PONG" {
		t.Fatalf("PING with the client certificate: %v %v", got, err)
	}
	// The server certificate names localhost too.
	conf := s.ClientConfig()
	conf.ServerName = "localhost"
	if _, err := Do(ctx, s.Addr, conf, "PING"); err != nil {
		t.Fatalf("PING verifying the name localhost: %v", err)
	}
	// Without a client certificate the handshake or the first reply fails
	// (with TLS 1.3 the server's refusal arrives after the handshake).
	conf = s.ClientConfig()
	conf.Certificates = nil
	if got, err := Do(ctx, s.Addr, conf, "PING"); err == nil {
		t.Fatalf("PING without a client certificate answered %v", got)
	}
	// --port 0: no plain-text listener, and the TLS port does not speak it.
	if err := ping(s.Addr); err == nil {
		t.Fatal("plain-text PING answered on the TLS port")
	}

	s.Stop()
	if err := s.Restart(); err != nil {
		t.Fatalf("restart a TLS server: %v", err)
	}
	if _, err := Do(ctx, s.Addr, s.ClientConfig(), "PING"); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
}

func TestTLSUntrusted(t *testing.T) {
	t.Parallel()
	s := StartTLSUntrusted(t)
	ctx := Context(t, 30*time.Second)
	_, err := Do(ctx, s.Addr, s.ClientConfig(), "PING")
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("PING to a server with an untrusted certificate: %v, want x509.UnknownAuthorityError", err)
	}
	// The same server answers a client that trusts the other CA: the failure
	// above is verification, nothing else.
	conf, err := clientConfig(s.PKI.UntrustedCAFile, s.CertFile, s.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Do(ctx, s.Addr, conf, "PING"); err != nil || got != "PONG" {
		t.Fatalf("PING trusting the untrusted CA: %v %v", got, err)
	}
}
