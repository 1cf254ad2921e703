// Package scripts tests the shell scripts beside it: what scripts/deps.sh
// installs for each make target, with dpkg-query, apt-get, sudo and id
// replaced by stubs on PATH, so nothing is installed.
package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// stubs stands in for the system: installed is what dpkg-query reports as
// installed (apt-get install adds to it unless brokenApt), calls logs every
// apt-get and sudo invocation one per line.
type stubs struct {
	dir, installed, calls string
}

func newStubs(t *testing.T, uid string, installed []string, brokenApt bool) *stubs {
	t.Helper()
	s := &stubs{dir: t.TempDir()}
	s.installed = filepath.Join(s.dir, "installed")
	s.calls = filepath.Join(s.dir, "calls")
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(s.dir, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(s.installed, []byte(strings.Join(installed, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// dpkg-query -W -f=FORMAT PACKAGE
	write("dpkg-query", `grep -qx "$3" `+s.installed+` && printf installed || { printf 'not-installed'; exit 1; }`+"\n")
	add := `for a; do case $a in -*|install|update) ;; *) echo "$a" >>` + s.installed + `;; esac; done`
	if brokenApt {
		add = ":"
	}
	write("apt-get", `echo "apt-get $*" >>`+s.calls+"\n"+add+"\n")
	write("sudo", `echo "sudo $*" >>`+s.calls+"\nexec \"$@\"\n")
	write("id", "echo "+uid+"\n")
	// A protoc on PATH, as when it came from elsewhere than Debian's
	// package: deps.sh must not take it for the package.
	write("protoc", "exit 0\n")
	return s
}

func (s *stubs) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("./deps.sh", args...)
	cmd.Env = append(os.Environ(), "PATH="+s.dir+":/usr/bin:/bin")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (s *stubs) log(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(s.calls)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// installLine returns the apt-get install call from the log.
func installLine(calls []string) string {
	for _, c := range calls {
		if strings.HasPrefix(c, "apt-get") && strings.Contains(c, " install ") {
			return c
		}
	}
	return ""
}

// The defect: protoc on PATH (protobuf-compiler installed) but
// libprotobuf-dev, which holds the well-known types, missing.
func TestDepsInstallsMissingPackageEvenWhenItsCommandIsPresent(t *testing.T) {
	s := newStubs(t, "0", []string{"protobuf-compiler"}, false)
	if out, err := s.run(t, "proto"); err != nil {
		t.Fatalf("deps.sh proto: %v\n%s", err, out)
	}
	calls := s.log(t)
	if len(calls) != 2 || !strings.HasPrefix(calls[0], "apt-get") || !strings.Contains(calls[0], " update") {
		t.Fatalf("want apt-get update then install, got %q", calls)
	}
	fields := strings.Fields(installLine(calls))
	if !slices.Contains(fields, "libprotobuf-dev") || slices.Contains(fields, "protobuf-compiler") {
		t.Errorf("install %q: want libprotobuf-dev only (protobuf-compiler is installed)", installLine(calls))
	}
	if !slices.Contains(fields, "--no-install-recommends") {
		t.Errorf("install %q: without --no-install-recommends", installLine(calls))
	}
}

func TestDepsCallsNoAptWhenEveryPackageIsInstalled(t *testing.T) {
	all := []string{"protobuf-compiler", "libprotobuf-dev", "prometheus", "systemd", "procps", "iproute2", "iperf3", "systemd-container", "debootstrap", "python3", "python3-venv", "libnuma1"}
	s := newStubs(t, "0", all, false)
	if out, err := s.run(t, "all"); err != nil {
		t.Fatalf("deps.sh all: %v\n%s", err, out)
	}
	if calls := s.log(t); len(calls) != 0 {
		t.Errorf("apt consulted with nothing missing: %q", calls)
	}
}

func TestDepsInstallsEachGroupsPackages(t *testing.T) {
	for group, want := range map[string][]string{
		"proto":         {"libprotobuf-dev", "protobuf-compiler"},
		"test":          {"iproute2", "procps", "prometheus", "systemd"},
		"bench":         {"iperf3"},
		"systemd-check": {"debootstrap", "systemd-container"},
		"fresh-check":   {"debootstrap"},
		"python":        {"python3", "python3-venv"},
		"engines":       {"libnuma1"},
	} {
		s := newStubs(t, "0", nil, false)
		if out, err := s.run(t, group); err != nil {
			t.Fatalf("deps.sh %s: %v\n%s", group, err, out)
		}
		var got []string
		for _, f := range strings.Fields(installLine(s.log(t))) {
			if !strings.HasPrefix(f, "-") && !strings.Contains(f, "=") && f != "apt-get" && f != "install" {
				got = append(got, f)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("deps.sh %s installed %q, want %q", group, got, want)
		}
	}
}

func TestDepsUsesSudoOnlyWhenNotRoot(t *testing.T) {
	for uid, wantSudo := range map[string]bool{"0": false, "1000": true} {
		s := newStubs(t, uid, nil, false)
		if out, err := s.run(t, "bench"); err != nil {
			t.Fatalf("uid %s: %v\n%s", uid, err, out)
		}
		sudo := slices.ContainsFunc(s.log(t), func(c string) bool { return strings.HasPrefix(c, "sudo ") })
		if sudo != wantSudo {
			t.Errorf("uid %s: sudo used %v, want %v (%q)", uid, sudo, wantSudo, s.log(t))
		}
	}
}

func TestDepsFailsWhenAptLeavesThePackageMissing(t *testing.T) {
	s := newStubs(t, "0", nil, true)
	out, err := s.run(t, "bench")
	if err == nil {
		t.Fatalf("deps.sh succeeded though iperf3 is still not installed:\n%s", out)
	}
	if !strings.Contains(out, "iperf3 still not installed") {
		t.Errorf("output does not name the package: %s", out)
	}
}

func TestDepsRefusesUnknownGroup(t *testing.T) {
	s := newStubs(t, "0", nil, false)
	if out, err := s.run(t, "tset"); err == nil {
		t.Fatalf("deps.sh tset succeeded:\n%s", out)
	}
	if calls := s.log(t); len(calls) != 0 {
		t.Errorf("apt consulted for an unknown group: %q", calls)
	}
}

// The Makefile decides per target: demo and build need no Debian package.
func TestMakeTargetsInstallOnlyWhatTheyNeed(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	for target, want := range map[string][]string{
		"build":         nil,
		"demo":          nil,
		"test":          {"scripts/deps.sh test", "scripts/deps.sh engines"},
		"engine-check":  {"scripts/deps.sh engines"},
		"proto":         {"scripts/deps.sh proto"},
		"bench":         {"scripts/deps.sh bench"},
		"fresh-check":   {"scripts/deps.sh fresh-check"},
		"deploy-check":  {"scripts/deps.sh test"},
		"twohost":       {"scripts/deps.sh test"},
		"systemd-check": {"scripts/deps.sh systemd-check"},
		"deps":          {"scripts/deps.sh all"},
	} {
		out, err := exec.Command("make", "-C", "..", "-n", target).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		var got []string
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "deps.sh") || strings.Contains(line, "apt-get") {
				got = append(got, strings.TrimSpace(line))
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("make %s: %q, want %q", target, got, want)
		}
	}
}
