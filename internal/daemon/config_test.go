package daemon

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/pdlink/pdlink/pkg/transfer"
)

func parse(t *testing.T, role Role, args []string, env map[string]string) (Config, error) {
	t.Helper()
	cfg := DefaultConfig(role)
	fs := pflag.NewFlagSet(string(role), pflag.ContinueOnError)
	cfg.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if err := ApplyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

func TestDefaultsAreValid(t *testing.T) {
	for _, role := range []Role{RolePrefill, RoleDecode} {
		cfg, err := parse(t, role, nil, nil)
		if err != nil {
			t.Fatalf("%s defaults refused: %v", role, err)
		}
		if want := "unix:///run/pdlink/" + string(role) + ".sock"; cfg.GRPCListen != want {
			t.Errorf("%s grpc-listen default %q, want %q", role, cfg.GRPCListen, want)
		}
	}
	p, _ := parse(t, RolePrefill, nil, nil)
	d, _ := parse(t, RoleDecode, nil, nil)
	if p.HTTPListen != "127.0.0.1:9400" || d.HTTPListen != "127.0.0.1:9401" {
		t.Errorf("http defaults %q %q", p.HTTPListen, d.HTTPListen)
	}
	if p.BootstrapListen != "tcp://127.0.0.1:8998" || d.DataListen != "127.0.0.1:9500" {
		t.Errorf("role defaults %q %q", p.BootstrapListen, d.DataListen)
	}
}

func TestRoleFlagsExistOnlyOnTheirDaemon(t *testing.T) {
	if _, err := parse(t, RoleDecode, []string{"--bootstrap-listen=tcp://127.0.0.1:1"}, nil); err == nil {
		t.Error("decoded accepted --bootstrap-listen")
	}
	if _, err := parse(t, RolePrefill, []string{"--data-listen=127.0.0.1:1"}, nil); err == nil {
		t.Error("prefilld accepted --data-listen")
	}
	if _, err := parse(t, RolePrefill, []string{"--shm-copy-workers=2"}, nil); err == nil {
		t.Error("prefilld accepted --shm-copy-workers: only decode copies same-host chunks")
	}
}

// TestShmCopyWorkersFlagSetsTheDecodeCopyWorkers: --shm-copy-workers (or
// PDLINK_SHM_COPY_WORKERS) is decoded's ReceiverConfig.CopyWorkers, 1 by
// default; outside 1 to transfer.MaxCopyWorkers it is refused naming the
// flag and the range.
func TestShmCopyWorkersFlagSetsTheDecodeCopyWorkers(t *testing.T) {
	if cfg, err := parse(t, RoleDecode, nil, nil); err != nil || cfg.ShmCopyWorkers != 1 {
		t.Fatalf("default: %d (%v), want 1", cfg.ShmCopyWorkers, err)
	}
	if cfg, err := parse(t, RoleDecode, []string{"--shm-copy-workers=4"}, nil); err != nil || cfg.ShmCopyWorkers != 4 {
		t.Fatalf("--shm-copy-workers=4: %d (%v)", cfg.ShmCopyWorkers, err)
	}
	if cfg, err := parse(t, RoleDecode, nil, map[string]string{"PDLINK_SHM_COPY_WORKERS": "2"}); err != nil || cfg.ShmCopyWorkers != 2 {
		t.Fatalf("PDLINK_SHM_COPY_WORKERS=2: %d (%v)", cfg.ShmCopyWorkers, err)
	}
	for _, v := range []string{"0", "-1", fmt.Sprint(transfer.MaxCopyWorkers + 1)} {
		_, err := parse(t, RoleDecode, []string{"--shm-copy-workers=" + v}, nil)
		if err == nil || !strings.Contains(err.Error(), "--shm-copy-workers") || !strings.Contains(err.Error(), fmt.Sprintf("1 to %d", transfer.MaxCopyWorkers)) {
			t.Errorf("--shm-copy-workers=%s: %v, want a refusal naming the flag and its range", v, err)
		}
	}
	if _, err := parse(t, RoleDecode, []string{fmt.Sprintf("--shm-copy-workers=%d", transfer.MaxCopyWorkers)}, nil); err != nil {
		t.Errorf("--shm-copy-workers=%d: %v", transfer.MaxCopyWorkers, err)
	}
}

func TestBadFlagValuesAreRefusedNamingTheFlag(t *testing.T) {
	cases := []struct {
		role Role
		arg  string
		flag string
	}{
		{RolePrefill, "--grpc-listen=unix://relative.sock", "grpc-listen"},
		{RolePrefill, "--grpc-listen=http://x:1", "grpc-listen"},
		{RolePrefill, "--grpc-listen=nohostport", "grpc-listen"},
		{RolePrefill, "--http-listen=127.0.0.1", "http-listen"},
		{RolePrefill, "--http-listen=example.com:80", "http-listen"},
		{RolePrefill, "--log-level=loud", "log-level"},
		{RolePrefill, "--log-format=xml", "log-format"},
		{RolePrefill, "--bootstrap-timeout=0s", "bootstrap-timeout"},
		{RolePrefill, "--waiting-timeout=-1s", "waiting-timeout"},
		{RolePrefill, "--transfer-idle-timeout=0s", "transfer-idle-timeout"},
		{RolePrefill, "--clear-linger=0s", "clear-linger"},
		{RolePrefill, "--heartbeat-interval=0s", "heartbeat-interval"},
		{RolePrefill, "--heartbeat-misses=0", "heartbeat-misses"},
		{RolePrefill, "--drain-timeout=-1s", "drain-timeout"},
		{RolePrefill, "--drain-terminal-grace=-1ms", "drain-terminal-grace"},
		{RoleDecode, "--drain-terminal-grace=401ms", "drain-terminal-grace"},
		{RolePrefill, "--max-rooms=0", "max-rooms"},
		{RolePrefill, "--bootstrap-listen=127.0.0.1:8998", "bootstrap-listen"},
		{RolePrefill, "--bootstrap-listen=ipc:///tmp/x", "bootstrap-listen"},
		{RoleDecode, "--data-listen=:99999", "data-listen"},
		{RoleDecode, "--data-advertise=nohost", "data-advertise"},
		{RoleDecode, "--data-advertise=0.0.0.0:9500", "data-advertise"},
		{RoleDecode, "--data-advertise=10.0.0.5:0", "data-advertise"},
		{RoleDecode, "--grpc-handshake-timeout=0s", "grpc-handshake-timeout"},
		{RoleDecode, "--grpc-max-connection-idle=0s", "grpc-max-connection-idle"},
		{RoleDecode, "--grpc-keepalive-time=500ms", "grpc-keepalive-time"},
		{RoleDecode, "--grpc-keepalive-timeout=0s", "grpc-keepalive-timeout"},
		{RoleDecode, "--grpc-keepalive-min-time=-1s", "grpc-keepalive-min-time"},
		{RoleDecode, "--grpc-max-connections=0", "grpc-max-connections"},
		{RolePrefill, "--data-transport=udp", "data-transport"},
		{RoleDecode, "--data-transport=", "data-transport"},
		{RolePrefill, "--region-dir=", "region-dir"},
		{RolePrefill, "--region-dir=relative/dir", "region-dir"},
		{RoleDecode, "--region-dir=/dev/shm/pdlink/", "region-dir"},
		{RoleDecode, "--region-dir=/dev/shm/../etc", "region-dir"},
	}
	for _, c := range cases {
		_, err := parse(t, c.role, []string{c.arg}, nil)
		if err == nil {
			t.Errorf("%s %s accepted", c.role, c.arg)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, "--"+c.flag) || strings.Contains(msg, "\n") {
			t.Errorf("%s %s: error %q does not name --%s on one line", c.role, c.arg, msg, c.flag)
		}
	}
}

func TestEveryFlagReadsItsEnvironmentVariable(t *testing.T) {
	for _, role := range []Role{RolePrefill, RoleDecode} {
		cfg := DefaultConfig(role)
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		cfg.BindFlags(fs)
		fs.VisitAll(func(f *pflag.Flag) {
			var seen string
			err := ApplyEnv(fs, func(k string) (string, bool) {
				if k == EnvName(f.Name) {
					seen = k
					return f.DefValue, true
				}
				return "", false
			})
			if err != nil || seen == "" {
				t.Errorf("%s: --%s not read from %s (err %v)", role, f.Name, EnvName(f.Name), err)
			}
		})
	}
}

func TestEnvironmentSetsFlagsAndCommandLineWins(t *testing.T) {
	env := map[string]string{
		"PDLINK_HEARTBEAT_MISSES":  "7",
		"PDLINK_WAITING_TIMEOUT":   "2s",
		"PDLINK_BOOTSTRAP_TIMEOUT": "9s",
	}
	cfg, err := parse(t, RolePrefill, []string{"--bootstrap-timeout=3s"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HeartbeatMisses != 7 || cfg.WaitingTimeout != 2*time.Second {
		t.Errorf("env not applied: %+v", cfg)
	}
	if cfg.BootstrapTimeout != 3*time.Second {
		t.Errorf("command line lost to env: %v", cfg.BootstrapTimeout)
	}
}

func TestBadEnvironmentValueNamesVariableAndFlag(t *testing.T) {
	_, err := parse(t, RoleDecode, nil, map[string]string{"PDLINK_MAX_ROOMS": "many"})
	if err == nil || !strings.Contains(err.Error(), "PDLINK_MAX_ROOMS") || !strings.Contains(err.Error(), "--max-rooms") {
		t.Fatalf("got %v", err)
	}
}

func TestParseListen(t *testing.T) {
	for in, want := range map[string][2]string{
		"unix:///run/pdlink/x.sock": {"unix", "/run/pdlink/x.sock"},
		"127.0.0.1:50051":           {"tcp", "127.0.0.1:50051"},
		"[::1]:0":                   {"tcp", "[::1]:0"},
		":9000":                     {"tcp", ":9000"},
	} {
		n, a, err := ParseListen(in)
		if err != nil || n != want[0] || a != want[1] {
			t.Errorf("ParseListen(%q) = %q %q %v", in, n, a, err)
		}
	}
}

func TestNonLoopbackListenersNeedASecretOrInsecure(t *testing.T) {
	_, err := parse(t, RoleDecode, []string{"--data-listen=0.0.0.0:9500", "--data-advertise=10.0.0.5:9500"}, nil)
	if err == nil || !strings.Contains(err.Error(), "--data-listen") || !strings.Contains(err.Error(), "--auth-token-file") {
		t.Fatalf("exposed data listener without a token: %v", err)
	}
	cfg, err := parse(t, RoleDecode, []string{"--data-listen=0.0.0.0:9500", "--data-advertise=10.0.0.5:9500", "--insecure"}, nil)
	if err != nil || !cfg.InsecureMode() {
		t.Fatalf("--insecure: %v, insecure mode %v", err, cfg.InsecureMode())
	}
	cfg, err = parse(t, RolePrefill, []string{"--bootstrap-listen=tcp://10.1.2.3:8998", "--auth-token-file=/etc/pdlink/token"}, nil)
	if err != nil || cfg.InsecureMode() {
		t.Fatalf("with a token: %v, insecure mode %v", err, cfg.InsecureMode())
	}
	// The token does not guard the scheduler API: gRPC beyond loopback
	// needs mTLS or --insecure.
	if _, err := parse(t, RolePrefill, []string{"--grpc-listen=0.0.0.0:50051", "--auth-token-file=/t"}, nil); err == nil || !strings.Contains(err.Error(), "--grpc-client-ca") {
		t.Fatalf("gRPC on 0.0.0.0 without mTLS: %v", err)
	}
	cfg, err = parse(t, RolePrefill, nil, nil)
	if err != nil || cfg.InsecureMode() {
		t.Fatalf("loopback defaults: %v, insecure mode %v", err, cfg.InsecureMode())
	}
}

// A wildcard data listener without --data-advertise would send 0.0.0.0 (or
// [::]) to prefill daemons, which cannot dial it: every room would end at a
// deadline with no error naming the cause. decoded refuses to start instead.
func TestWildcardDataListenNeedsAnAdvertiseAddress(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:9500", "[::]:9500", ":9500"} {
		_, err := parse(t, RoleDecode, []string{"--data-listen=" + listen, "--insecure"}, nil)
		if err == nil || !strings.Contains(err.Error(), "--data-advertise") {
			t.Errorf("--data-listen=%s without --data-advertise: err %v, want one naming --data-advertise", listen, err)
		}
		if _, err := parse(t, RoleDecode, []string{"--data-listen=" + listen, "--insecure", "--data-advertise=10.0.0.5:9500"}, nil); err != nil {
			t.Errorf("--data-listen=%s with --data-advertise: %v", listen, err)
		}
	}
}

// --region-dir defaults to the unit's directory; given once it replaces the
// default, given again (or comma-separated, as PDLINK_REGION_DIR in an env
// file) it adds more; the command line wins over the environment.
func TestRegionDirsDefaultRepeatAndCommas(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"default", nil, nil, DefaultRegionDir},
		{"one flag replaces the default", []string{"--region-dir=/srv/regions"}, nil, "/srv/regions"},
		{"repeated", []string{"--region-dir=/a", "--region-dir=/b"}, nil, "/a,/b"},
		{"comma-separated", []string{"--region-dir=/a,/b"}, nil, "/a,/b"},
		{"environment", nil, map[string]string{"PDLINK_REGION_DIR": "/dev/shm/pdlink,/dev/shm/pdlink-rank1"}, "/dev/shm/pdlink,/dev/shm/pdlink-rank1"},
		{"command line wins", []string{"--region-dir=/a"}, map[string]string{"PDLINK_REGION_DIR": "/b"}, "/a"},
	} {
		for _, role := range []Role{RolePrefill, RoleDecode} {
			cfg, err := parse(t, role, tc.args, tc.env)
			if err != nil {
				t.Fatalf("%s %s: %v", tc.name, role, err)
			}
			if got := strings.Join(cfg.RegionDirs, ","); got != tc.want {
				t.Errorf("%s %s: region dirs %q, want %q", tc.name, role, got, tc.want)
			}
		}
	}
}
