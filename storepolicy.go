package redislock

import (
	"fmt"
	"strconv"
	"strings"
)

// storePolicy is which answers idempotency mode stores: `store` parsed.
// An answer it does not store frees the key, so that the retry runs;
// outcome-unknown is stored whatever it says.
type storePolicy struct {
	classes [6]bool      // "2xx": index 2
	codes   map[int]bool // named statuses
}

// parseStorePolicy parses `store`'s entries: a class (2xx to 5xx), which
// stores its statuses but 408, 425, 429 and 503 (the ones that say "not
// processed, try again"), or a final status (200 to 599), stored when
// named.
// No entries is the default: every answer but those four.
func parseStorePolicy(entries []string) (*storePolicy, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	p := &storePolicy{codes: map[int]bool{}}
	for _, e := range entries {
		s := strings.ToLower(e)
		if len(s) == 3 && s[1:] == "xx" && s[0] >= '2' && s[0] <= '5' {
			p.classes[s[0]-'0'] = true
			continue
		}
		code, err := strconv.Atoi(s)
		if err != nil || len(s) != 3 || code < 200 || code > 599 {
			return nil, fmt.Errorf("idempotency: store %q is neither a class (2xx, 3xx, 4xx, 5xx) nor a status (200 to 599)", e)
		}
		p.codes[code] = true
	}
	return p, nil
}

// stores reports whether an answer with status is kept for retries.
func (p *storePolicy) stores(status int) bool {
	if p == nil {
		return !notProcessed(status)
	}
	if p.codes[status] {
		return true
	}
	class := status / 100
	return class >= 2 && class <= 5 && p.classes[class] && !notProcessed(status)
}
