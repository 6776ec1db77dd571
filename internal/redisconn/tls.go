package redisconn

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLS is TLS to Redis, from PEM files.
type TLS struct {
	CA                 string // the authorities to trust; "": the system roots
	Cert, Key          string // a client certificate; both or neither
	ServerName         string // the name checked in the server certificate
	InsecureSkipVerify bool   // no verification (tests only)
}

// config builds the client TLS configuration; nil without TLS.
func (t *TLS) config() (*tls.Config, error) {
	if t == nil {
		return nil, nil
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // opt-in, documented as tests only
	}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("reading redis tls ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis tls ca %s: no PEM certificates", t.CA)
		}
		cfg.RootCAs = pool
	}
	if t.Cert != "" {
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("loading redis tls client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
