package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/daemon"
)

var roles = []daemon.Role{daemon.RolePrefill, daemon.RoleDecode}

// envFile renders the environment file of a role from the daemon's own
// flags: every PDLINK_* variable, commented out, with its default.
func envFile(role daemon.Role) []byte {
	cmd := daemon.NewCommand(role, "", "", nil)
	var b bytes.Buffer
	fmt.Fprintf(&b, "# /etc/pdlink/%s.env: environment of %s.service (EnvironmentFile=).\n", role, role)
	b.WriteString("# Every flag of the daemon is also read from PDLINK_<FLAG_NAME>; a flag on the\n")
	b.WriteString("# command line wins. Each variable is listed commented out with its default;\n")
	b.WriteString("# uncomment to change it. Durations are Go durations (500ms, 30s, 5m).\n")
	b.WriteString("# Generated from the flags: go test ./deploy -run TestEnvFilesListEveryFlag -update\n")
	cmd.Flags().VisitAll(func(f *pflagFlag) {
		fmt.Fprintf(&b, "\n# --%s: %s\n#%s=%s\n", f.Name, f.Usage, daemon.EnvName(f.Name), f.DefValue)
	})
	return b.Bytes()
}

func TestEnvFilesListEveryFlag(t *testing.T) {
	for _, role := range roles {
		golden(t, "systemd/"+string(role)+".env", envFile(role))
	}
}

// flagEnvNames returns the PDLINK_* variables a role reads.
func flagEnvNames(role daemon.Role) map[string]string {
	out := map[string]string{}
	daemon.NewCommand(role, "", "", nil).Flags().VisitAll(func(f *pflagFlag) {
		out[daemon.EnvName(f.Name)] = f.DefValue
	})
	return out
}

// unit is a parsed systemd unit: section -> key -> values in order.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, b []byte) unit {
	t.Helper()
	u := unit{}
	sec := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			sec = strings.Trim(line, "[]")
			u[sec] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || sec == "" {
				t.Fatalf("line %d: not key=value in a section: %q", n, line)
			}
			u[sec][k] = append(u[sec][k], v)
		}
	}
	return u
}

// one returns the single value of a key, failing if it is unset or repeated.
func (u unit) one(t *testing.T, sec, key string) string {
	t.Helper()
	v := u[sec][key]
	if len(v) != 1 {
		t.Errorf("[%s] %s: want exactly one value, got %q", sec, key, v)
		return ""
	}
	return v[0]
}

func systemdDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("duration %q: %v", s, err)
	}
	return d
}

// TestUnitsKeepTheContract reads each unit for the settings the daemons and
// the engine rely on; systemd-analyze cannot know them.
func TestUnitsKeepTheContract(t *testing.T) {
	for _, role := range roles {
		t.Run(string(role), func(t *testing.T) {
			u := parseUnit(t, readFile(t, "systemd/"+string(role)+".service"))
			cfg := daemon.DefaultConfig(role)
			want := map[string]string{
				"Type":                  "notify",
				"NotifyAccess":          "main",
				"ExecStart":             "/usr/local/bin/" + string(role),
				"EnvironmentFile":       "-/etc/pdlink/" + string(role) + ".env",
				"Restart":               "on-failure",
				"User":                  "pdlink",
				"Group":                 "pdlink",
				"UMask":                 "0007",
				"RuntimeDirectory":      "pdlink",
				"NoNewPrivileges":       "yes",
				"ProtectSystem":         "strict",
				"PrivateTmp":            "yes",
				"CapabilityBoundingSet": "",
				"AmbientCapabilities":   "",
				"ReadOnlyPaths":         "/dev/shm",
				"ReadWritePaths":        "/dev/shm/pdlink",
				// RegisterRegion maps files only from there (issue 15).
				"Environment": "PDLINK_REGION_DIR=" + daemon.DefaultRegionDir,
				// RemoveIPC=yes deletes every file under /dev/shm of the
				// pdlink user or group when the last pdlink unit stops: the
				// region directory and the engine's KV regions in it.
				"RemoveIPC": "no",
				// /bin/kill is procps, missing from a minimal Debian.
				"ExecReload": "/bin/sh -c 'kill -HUP ${MAINPID}'",
			}
			for k, v := range want {
				if got := u.one(t, "Service", k); got != v {
					t.Errorf("%s=%q, want %q", k, got, v)
				}
			}
			// The region directory is the one tmpfiles.d makes, the engine's
			// group owning it, setgid so its regions stay in the group.
			if tmpfiles := "d " + daemon.DefaultRegionDir + " 2770 root pdlink -"; !strings.Contains(string(readFile(t, "systemd/pdlink.tmpfiles.conf")), "\n"+tmpfiles+"\n") {
				t.Errorf("pdlink.tmpfiles.conf does not make the region directory: want a line %q", tmpfiles)
			}
			if got := cfg.RegionDirs; len(got) != 1 || got[0] != u.one(t, "Service", "ReadWritePaths") {
				t.Errorf("default --region-dir %q is not the unit's ReadWritePaths", got)
			}
			// The default scheduler socket lives in the RuntimeDirectory.
			if got, want := cfg.GRPCListen, "unix:///run/pdlink/"+string(role)+".sock"; got != want {
				t.Errorf("default --grpc-listen is %s, the unit's RuntimeDirectory gives %s", got, want)
			}
			if wd := systemdDuration(t, u.one(t, "Service", "WatchdogSec")); wd < 2*time.Second {
				t.Errorf("WatchdogSec=%s: the daemon pings at half of it; keep it well above a scheduling hiccup", wd)
			}
			// SIGTERM drains for at most --drain-timeout; systemd must not
			// SIGKILL before the drain ends and the daemon stops.
			stop := systemdDuration(t, u.one(t, "Service", "TimeoutStopSec"))
			if stop < cfg.DrainTimeout+10*time.Second {
				t.Errorf("TimeoutStopSec=%s does not leave 10s past --drain-timeout %s", stop, cfg.DrainTimeout)
			}
		})
	}
}

// verifyUnit runs systemd-analyze verify on a copy of a unit whose
// ExecStart points at a stub executable (verify checks that it exists), and
// returns an error for any complaint: verify exits 0 on unknown keys and
// bad values, it only prints them.
func verifyUnit(t *testing.T, analyze, name string, content []byte) error {
	t.Helper()
	dir := t.TempDir()
	stub := filepath.Join(dir, "stub")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^ExecStart=\S+`)
	if !re.Match(content) {
		return fmt.Errorf("%s: no ExecStart", name)
	}
	content = re.ReplaceAll(content, []byte("ExecStart="+stub))
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, 30*time.Second, dir, analyze, "verify", "--man=no", path)
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		return fmt.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
	}
	return nil
}

// exposure runs systemd-analyze security offline and returns an error when
// the unit's exposure is above max (0..10, systemd's own scale).
func exposure(t *testing.T, analyze, name string, content []byte, max float64) error {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, 30*time.Second, dir, analyze, "security", "--offline=yes", "--no-pager",
		fmt.Sprintf("--threshold=%d", int(max*10)), path)
	if err != nil {
		return fmt.Errorf("systemd-analyze security %s: exposure above %.1f (%v)\n%s", name, max, err, out)
	}
	return nil
}

func TestUnitsPassSystemdAnalyze(t *testing.T) {
	t.Parallel()
	analyze := tool(t, "systemd-analyze", "systemd")
	for _, role := range roles {
		name := string(role) + ".service"
		b := readFile(t, "systemd/"+name)
		if err := verifyUnit(t, analyze, name, b); err != nil {
			t.Error(err)
		}
		if err := exposure(t, analyze, name, b, 2.0); err != nil {
			t.Error(err)
		}
	}
}

// TestSystemdAnalyzeCatchesBrokenUnits proves the checks above can fail: a
// misspelt key, a bad value and a unit without hardening.
func TestSystemdAnalyzeCatchesBrokenUnits(t *testing.T) {
	t.Parallel()
	analyze := tool(t, "systemd-analyze", "systemd")
	good := readFile(t, "systemd/decoded.service")
	for _, tc := range []struct{ name, from, to string }{
		{"misspelt key", "NoNewPrivileges=yes", "NoNewPrivilege=yes"},
		{"bad value", "Restart=on-failure", "Restart=sometimes"},
		{"bad section", "[Service]", "[Servce]"},
	} {
		bad := bytes.Replace(good, []byte(tc.from), []byte(tc.to), 1)
		if bytes.Equal(bad, good) {
			t.Fatalf("%s: %q not in the unit", tc.name, tc.from)
		}
		if err := verifyUnit(t, analyze, "decoded.service", bad); err == nil {
			t.Errorf("%s: systemd-analyze verify accepted it", tc.name)
		}
	}
	var bare bytes.Buffer
	for _, line := range strings.SplitAfter(string(good), "\n") {
		if k, _, _ := strings.Cut(line, "="); hardeningKeys[k] {
			continue
		}
		bare.WriteString(line)
	}
	if err := exposure(t, analyze, "decoded.service", bare.Bytes(), 2.0); err == nil {
		t.Error("a unit without hardening passed the exposure check")
	}
}

var hardeningKeys = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range strings.Fields(`NoNewPrivileges CapabilityBoundingSet AmbientCapabilities ProtectSystem
		ReadOnlyPaths ReadWritePaths ProtectHome PrivateMounts PrivateTmp DevicePolicy ProtectKernelTunables ProtectKernelModules
		ProtectKernelLogs ProtectControlGroups ProtectClock ProtectHostname ProtectProc ProcSubset
		RestrictAddressFamilies RestrictNamespaces RestrictRealtime RestrictSUIDSGID LockPersonality
		MemoryDenyWriteExecute RemoveIPC KeyringMode SystemCallArchitectures SystemCallFilter
		SystemCallErrorNumber UMask User Group`) {
		m[k] = true
	}
	return m
}()

// TestDeployedVariablesAreFlags: a misspelt PDLINK_* variable is silently
// ignored by the daemon, so every one in the deploy files must be a flag.
func TestEnvFileVariablesAreFlags(t *testing.T) {
	re := regexp.MustCompile(`PDLINK_[A-Z0-9_]+`)
	for _, role := range roles {
		flags := flagEnvNames(role)
		path := "systemd/" + string(role) + ".env"
		var unknown []string
		for _, v := range re.FindAllString(string(readFile(t, path)), -1) {
			if _, ok := flags[v]; !ok {
				unknown = append(unknown, v)
			}
		}
		sort.Strings(unknown)
		if len(unknown) > 0 {
			t.Errorf("%s names variables %s reads from no flag", path, unknown)
		}
	}
}

// installSteps returns the shell lines of a unit's "# Install" comment.
func installSteps(unitFile []byte) []string {
	var steps []string
	in := false
	for _, line := range strings.Split(string(unitFile), "\n") {
		switch {
		case strings.HasPrefix(line, "# Install"):
			in = true
		case in && strings.HasPrefix(line, "#   "):
			steps = append(steps, strings.TrimPrefix(line, "#   "))
		case in:
			return steps
		}
	}
	return steps
}

// docInstallSteps returns the lines of the systemd sh block of the
// deployment page (docs/deployment.md).
func docInstallSteps(page []byte) []string {
	_, rest, ok := strings.Cut(string(page), "## systemd\n```sh\n")
	if !ok {
		return nil
	}
	block, _, _ := strings.Cut(rest, "```")
	return strings.Split(strings.TrimSpace(block), "\n")
}

// missingInstallDirs returns the directories that steps install a file into
// without creating them first (install -d) and that a systemd host does not
// already have.
func missingInstallDirs(steps []string) []string {
	have := map[string]bool{"/usr/local/bin": true, "/usr/lib/sysusers.d": true,
		"/usr/lib/tmpfiles.d": true, "/etc/systemd/system": true}
	var missing []string
	for _, line := range steps {
		line, _, _ = strings.Cut(line, "#")
		for _, cmd := range strings.Split(line, "&&") {
			args := strings.Fields(cmd)
			if len(args) == 0 || args[0] != "install" {
				continue
			}
			var operands []string
			makeDirs := false
			for i := 1; i < len(args); i++ {
				switch args[i] {
				case "-d":
					makeDirs = true
				case "-m", "-g", "-o":
					i++
				default:
					operands = append(operands, args[i])
				}
			}
			if makeDirs {
				for _, d := range operands {
					have[filepath.Clean(d)] = true
				}
				continue
			}
			if len(operands) < 2 {
				continue
			}
			dest := operands[len(operands)-1]
			dir := filepath.Dir(dest)
			if strings.HasSuffix(dest, "/") {
				dir = filepath.Clean(dest)
			}
			if !have[dir] {
				missing = append(missing, dir)
			}
		}
	}
	return missing
}

// An install that stops at "No such file or directory" halfway leaves a
// user and a tmpfiles entry but no unit: the unit comments once lacked
// install -d /etc/pdlink. make systemd-check runs these steps for real.
func TestInstallStepsCreateTheDirectoriesTheyInstallInto(t *testing.T) {
	sources := map[string][]string{"docs/deployment.md": docInstallSteps(readFile(t, "../docs/deployment.md"))}
	for _, role := range roles {
		name := "systemd/" + string(role) + ".service"
		sources[name] = installSteps(readFile(t, name))
	}
	for name, steps := range sources {
		if len(steps) < 5 {
			t.Errorf("%s: found %d install steps, want the whole sequence: %q", name, len(steps), steps)
			continue
		}
		if m := missingInstallDirs(steps); len(m) > 0 {
			t.Errorf("%s installs into %v without install -d first", name, m)
		}
	}
	// The check can fail: the unit comments as they were.
	old := []string{"install -m 0640 -g pdlink decoded.env /etc/pdlink/decoded.env"}
	if m := missingInstallDirs(old); len(m) != 1 || m[0] != "/etc/pdlink" {
		t.Errorf("missingInstallDirs(%q) = %v, want [/etc/pdlink]", old, m)
	}
}
