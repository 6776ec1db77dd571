package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// PKI is a throwaway set of PEM files: a private CA with a server certificate
// (IP 127.0.0.1, DNS localhost) and a client certificate it signed, and a
// second CA nobody trusts with its own server certificate, for the
// verification-failure tests. Generated per test so that no key is checked in
// and none expires under the repository.
type PKI struct {
	Dir string

	CAFile         string // the private CA: clients trust it, the server verifies clients with it
	ServerCertFile string
	ServerKeyFile  string
	ClientCertFile string
	ClientKeyFile  string

	UntrustedCAFile         string
	UntrustedServerCertFile string
	UntrustedServerKeyFile  string
}

// NewPKI writes a fresh PKI into dir.
func NewPKI(dir string) (*PKI, error) {
	p := &PKI{Dir: dir}
	ca, caKey, err := writeCA(dir, "ca", "redistest CA")
	if err != nil {
		return nil, err
	}
	p.CAFile = filepath.Join(dir, "ca.crt")
	if p.ServerCertFile, p.ServerKeyFile, err = writeLeaf(dir, "server", ca, caKey, true); err != nil {
		return nil, err
	}
	if p.ClientCertFile, p.ClientKeyFile, err = writeLeaf(dir, "client", ca, caKey, false); err != nil {
		return nil, err
	}
	uca, ucaKey, err := writeCA(dir, "untrusted-ca", "redistest untrusted CA")
	if err != nil {
		return nil, err
	}
	p.UntrustedCAFile = filepath.Join(dir, "untrusted-ca.crt")
	if p.UntrustedServerCertFile, p.UntrustedServerKeyFile, err = writeLeaf(dir, "untrusted-server", uca, ucaKey, true); err != nil {
		return nil, err
	}
	return p, nil
}

// ClientConfig returns a client *tls.Config that trusts the private CA and
// presents the client certificate.
func (p *PKI) ClientConfig() (*tls.Config, error) {
	return clientConfig(p.CAFile, p.ClientCertFile, p.ClientKeyFile)
}

func clientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("redistest: no certificate in %s", caFile)
	}
	conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}

// randomSerial returns a random 128-bit serial: unique without shared state.
func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

func writeCA(dir, name, cn string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

// writeLeaf writes name.crt and name.key signed by ca: a server certificate
// for 127.0.0.1 and localhost, or a client certificate.
func writeLeaf(dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, server bool) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	sn, err := randomSerial()
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: "redistest " + name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	if err := writePEM(keyFile, "PRIVATE KEY", keyDER); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// TLSServer is a redis-server that speaks only TLS and requires a client
// certificate signed by its PKI's CA.
type TLSServer struct {
	*Server
	PKI *PKI

	// What a client needs: the CA to trust and its certificate and key.
	CAFile, CertFile, KeyFile string

	// Untrusted reports that the server presents the untrusted CA's
	// certificate, so that a client trusting CAFile must fail verification.
	Untrusted bool

	pkiDir string
}

// ClientConfig returns a *tls.Config that trusts CAFile and presents the
// client certificate; set Certificates to nil on it to test a client
// without one.
func (t *TLSServer) ClientConfig() *tls.Config {
	conf, err := clientConfig(t.CAFile, t.CertFile, t.KeyFile)
	if err != nil {
		panic(err) // the files were read at start; losing them is a bug here
	}
	return conf
}

// Close stops the server and removes its certificates.
func (t *TLSServer) Close() {
	t.Server.Close()
	os.RemoveAll(t.pkiDir)
}

// StartTLS starts a TLS-only redis-server (--port 0) with a fresh PKI,
// requiring client certificates, stopped when tb ends.
func StartTLS(tb testing.TB, extraArgs ...string) *TLSServer {
	tb.Helper()
	return startTLS(tb, false, extraArgs)
}

// StartTLSUntrusted is StartTLS with the server presenting a certificate from
// the untrusted CA: clients configured from the TLSServer must reject it.
func StartTLSUntrusted(tb testing.TB, extraArgs ...string) *TLSServer {
	tb.Helper()
	return startTLS(tb, true, extraArgs)
}

func startTLS(tb testing.TB, untrusted bool, extraArgs []string) *TLSServer {
	tb.Helper()
	Require(tb)
	t, err := LaunchTLS(untrusted, extraArgs...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(t.Close)
	return t
}

// LaunchTLS starts a TLS-only redis-server with a fresh PKI, presenting the
// untrusted CA's certificate when untrusted is true; the caller must Close it.
func LaunchTLS(untrusted bool, extraArgs ...string) (*TLSServer, error) {
	dir, err := os.MkdirTemp("", "redistest-pki-")
	if err != nil {
		return nil, err
	}
	p, err := NewPKI(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	t := &TLSServer{PKI: p, CAFile: p.CAFile, CertFile: p.ClientCertFile, KeyFile: p.ClientKeyFile, Untrusted: untrusted, pkiDir: dir}
	certFile, keyFile := p.ServerCertFile, p.ServerKeyFile
	pingCA := p.CAFile
	if untrusted {
		certFile, keyFile, pingCA = p.UntrustedServerCertFile, p.UntrustedServerKeyFile, p.UntrustedCAFile
	}
	// The readiness PING must pass verification whichever CA serves.
	pingConf, err := clientConfig(pingCA, p.ClientCertFile, p.ClientKeyFile)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	t.Server, err = launch(spec{
		args:    extraArgs,
		pingTLS: pingConf,
		portArgs: func(port int) []string {
			return []string{
				"--port", "0", "--tls-port", strconv.Itoa(port),
				"--tls-cert-file", certFile, "--tls-key-file", keyFile,
				"--tls-ca-cert-file", p.CAFile, "--tls-auth-clients", "yes",
			}
		},
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redistest: TLS server (needs a redis-server built with BUILD_TLS=yes): %w", err)
	}
	return t, nil
}
