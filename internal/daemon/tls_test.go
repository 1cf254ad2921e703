package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

type testPKI struct {
	caPEM, serverCert, serverKey, clientCert, clientKey []byte
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	pemOf := func(typ string, der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}) }
	keyPEM := func(k *ecdsa.PrivateKey) []byte {
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pemOf("EC PRIVATE KEY", der)
	}
	caKey := key()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pdlink test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage) ([]byte, []byte) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "pdlink"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return pemOf("CERTIFICATE", der), keyPEM(k)
	}
	p := testPKI{caPEM: pemOf("CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf(2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf(3, x509.ExtKeyUsageClientAuth)
	return p
}

func write(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// gRPC on TCP with --grpc-tls-cert/--grpc-tls-key/--grpc-client-ca: a
// client with a certificate from the CA is served, one without is refused.
func TestGRPCOverTCPWithMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	dir := t.TempDir()
	cfg := testConfig(t)
	cfg.GRPCListen = "127.0.0.1:0"
	cfg.GRPCTLSCert = write(t, dir, "server.pem", pki.serverCert)
	cfg.GRPCTLSKey = write(t, dir, "server.key", pki.serverKey)
	cfg.GRPCClientCA = write(t, dir, "ca.pem", pki.caPEM)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(cfg, zap.NewNop(), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pki.caPEM)
	check := func(withCert bool) error {
		tc := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		if withCert {
			c, err := tls.X509KeyPair(pki.clientCert, pki.clientKey)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{c}
		}
		conn, err := grpc.NewClient("passthrough:///"+s.GRPCAddr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, ccancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer ccancel()
		_, err = healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(true); err != nil {
		t.Fatalf("client with a CA-signed certificate refused: %v", err)
	}
	if err := check(false); err == nil {
		t.Fatal("client without a certificate was served")
	}
}

func TestTLSFlagsAreCheckedTogether(t *testing.T) {
	cfg := DefaultConfig(RolePrefill)
	cfg.GRPCListen = "127.0.0.1:0"
	cfg.GRPCTLSCert = "/x.pem"
	if err := cfg.Validate(); err == nil {
		t.Error("--grpc-tls-cert without --grpc-tls-key accepted")
	}
	cfg = DefaultConfig(RolePrefill)
	cfg.GRPCClientCA = "/ca.pem"
	if err := cfg.Validate(); err == nil {
		t.Error("--grpc-client-ca without a server certificate accepted")
	}
	cfg = DefaultConfig(RolePrefill)
	cfg.GRPCTLSCert, cfg.GRPCTLSKey = "/x.pem", "/x.key"
	if err := cfg.Validate(); err == nil {
		t.Error("TLS on the unix socket accepted")
	}
}
