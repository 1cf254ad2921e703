package daemon

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/transfer"
)

// TestUnknownDataTransportIsRefusedNamingTheFlag: a --data-transport (or
// PDLINK_DATA_TRANSPORT) this build does not have stops the daemon before
// anything is set up, with one line naming the flag and the accepted values,
// instead of a daemon whose first RegisterRegion fails.
func TestUnknownDataTransportIsRefusedNamingTheFlag(t *testing.T) {
	for _, role := range []Role{RolePrefill, RoleDecode} {
		for _, via := range []string{"flag", "env"} {
			t.Run(string(role)+"/"+via, func(t *testing.T) {
				// Should the value get past validation, setup refuses to go
				// on, so the daemon never serves on the test's listeners.
				cmd := NewCommand(role, "test", "a daemon", func(*Server, Config, *zap.Logger) error {
					return errors.New("setup ran with an unknown data transport")
				})
				cmd.SetOut(&bytes.Buffer{})
				cmd.SetErr(&bytes.Buffer{})
				args := []string{"--grpc-listen=unix://" + filepath.Join(t.TempDir(), "grpc.sock"), "--http-listen=127.0.0.1:0"}
				switch via {
				case "flag":
					args = append(args, "--data-transport=rdma")
				case "env":
					t.Setenv(EnvName("data-transport"), "rdma")
				}
				cmd.SetArgs(args)
				err := cmd.Execute()
				if err == nil {
					t.Fatal("started with --data-transport=rdma")
				}
				msg := err.Error()
				if strings.Contains(msg, "\n") || !strings.Contains(msg, "--data-transport") || !strings.Contains(msg, `"rdma"`) {
					t.Fatalf("error %q: want one line naming --data-transport and the value", msg)
				}
				for _, k := range transfer.Kinds() {
					if !strings.Contains(msg, string(k)) {
						t.Errorf("error %q does not list the accepted value %q", msg, k)
					}
				}
			})
		}
	}
}

// Every accepted kind parses into the Config, from the flag and from the
// environment, and the default is auto (same-host pages where proven, TCP elsewhere).
func TestDataTransportDefaultsToAutoAndTakesEveryKind(t *testing.T) {
	for _, role := range []Role{RolePrefill, RoleDecode} {
		cfg, err := parse(t, role, nil, nil)
		if err != nil || cfg.DataTransport != transfer.KindAuto {
			t.Fatalf("%s default data transport %q (%v), want auto", role, cfg.DataTransport, err)
		}
		for _, k := range transfer.Kinds() {
			if cfg, err := parse(t, role, []string{"--data-transport=" + string(k)}, nil); err != nil || cfg.DataTransport != k {
				t.Errorf("%s --data-transport=%s: %q %v", role, k, cfg.DataTransport, err)
			}
			if cfg, err := parse(t, role, nil, map[string]string{"PDLINK_DATA_TRANSPORT": string(k)}); err != nil || cfg.DataTransport != k {
				t.Errorf("%s PDLINK_DATA_TRANSPORT=%s: %q %v", role, k, cfg.DataTransport, err)
			}
		}
	}
}
