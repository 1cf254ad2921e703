package auth

import (
	"errors"
	"strings"
	"testing"
)

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8998":            true,
		"127.1.2.3:0":               true,
		"[::1]:9500":                true,
		"[::ffff:127.0.0.1]:9500":   true,
		"localhost:9500":            true,
		"LOCALHOST:9500":            true,
		"tcp://127.0.0.1:8998":      true,
		"tcp://[::1]:8998":          true,
		"unix:///run/pdlink/p.sock": true,
		"ipc:///run/pdlink/boot":    true,
		"inproc://boot":             true,
		"/run/pdlink/p.sock":        true,
		"0.0.0.0:8998":              false,
		"[::]:8998":                 false,
		":8998":                     false,
		"tcp://*:8998":              false,
		"tcp://0.0.0.0:8998":        false,
		"tcp://eth0:8998":           false,
		"10.0.0.2:9500":             false,
		"[fe80::1%eth0]:9500":       false,
		"decode-0.svc:9500":         false,
	} {
		got, err := IsLoopback(addr)
		if err != nil || got != want {
			t.Errorf("IsLoopback(%q) = %v, %v; want %v", addr, got, err, want)
		}
	}
	for _, bad := range []string{"http://127.0.0.1:80", "127.0.0.1", "tcp://nohost"} {
		if _, err := IsLoopback(bad); !errors.Is(err, ErrBadListen) {
			t.Errorf("IsLoopback(%q) err = %v, want ErrBadListen", bad, err)
		}
	}
}

func TestStartingOnANonLoopbackAddressWithoutATokenFailsWithAClearMessage(t *testing.T) {
	eps := []Endpoint{{"grpc-listen", "unix:///run/pdlink/decode.sock"}, {"data-listen", "0.0.0.0:9500"}}
	exposed, err := CheckListen(false, false, eps...)
	if !errors.Is(err, ErrInsecureListen) {
		t.Fatalf("err = %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"--data-listen", `"0.0.0.0:9500"`, "--auth-token-file", "PDLINK_AUTH_TOKEN_FILE", "--insecure"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("message %q is not one line", msg)
	}
	if len(exposed) != 1 || exposed[0].Flag != "data-listen" {
		t.Fatalf("exposed = %v", exposed)
	}
}

func TestCheckListenAllowsLoopbackASecretOrInsecure(t *testing.T) {
	wild := Endpoint{"bootstrap-listen", "tcp://0.0.0.0:8998"}
	lo := Endpoint{"bootstrap-listen", "tcp://127.0.0.1:8998"}
	for _, tc := range []struct {
		name             string
		secret, insecure bool
		ep               Endpoint
		exposed          int
	}{
		{"loopback without secret", false, false, lo, 0},
		{"wildcard with secret", true, false, wild, 1},
		{"wildcard insecure", false, true, wild, 1},
	} {
		exposed, err := CheckListen(tc.secret, tc.insecure, tc.ep)
		if err != nil || len(exposed) != tc.exposed {
			t.Errorf("%s: %v, %v", tc.name, exposed, err)
		}
	}
	if _, err := CheckListen(true, true, Endpoint{"data-listen", "nope"}); !errors.Is(err, ErrBadListen) || !strings.Contains(err.Error(), "--data-listen") {
		t.Errorf("bad address: %v", err)
	}
}
