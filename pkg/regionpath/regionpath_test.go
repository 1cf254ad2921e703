package regionpath

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"
)

// tree is two region directories a and b under one temp dir, with
// whatever each case adds around them.
type tree struct {
	t    *testing.T
	base string
}

func newTree(t *testing.T) tree {
	t.Helper()
	base := t.TempDir()
	for _, d := range []string{"a", "b", "ab", "outside", "realup/a"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return tree{t, base}
}

func (tr tree) path(rel string) string { return filepath.Join(tr.base, rel) }

func (tr tree) file(rel string) string {
	tr.t.Helper()
	p := tr.path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(p, make([]byte, 64), 0o600); err != nil {
		tr.t.Fatal(err)
	}
	return p
}

func (tr tree) symlink(target, rel string) string {
	tr.t.Helper()
	p := tr.path(rel)
	if err := os.Symlink(target, p); err != nil {
		tr.t.Fatal(err)
	}
	return p
}

func newChecker(t *testing.T, cfg Config) (*Checker, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.WarnLevel)
	cfg.Logger = zap.New(core)
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, logs
}

func otherGID(t *testing.T) int {
	t.Helper()
	mine, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	mine = append(mine, os.Getegid())
	for g := 54321; ; g++ {
		if !contains(mine, g) {
			return g
		}
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Each rule of issue 15, one path breaking it (or, for the accepted
// cases, none), with two region directories configured.
func TestRegionPathRules(t *testing.T) {
	tr := newTree(t)
	dirs := []string{tr.path("a"), tr.path("b"), tr.path("linkdir"), tr.path("up/a")}
	tr.symlink(tr.path("a"), "linkdir")
	tr.symlink(tr.path("realup"), "up")
	inA := tr.file("a/region")
	secret := tr.file("outside/secret")
	cases := []struct {
		name string
		path func() string
		rule Rule // numRules: accepted
	}{
		{"accepted in the first dir", func() string { return inA }, numRules},
		{"accepted in the second dir", func() string { return tr.file("b/region") }, numRules},
		{"accepted in a subdirectory", func() string { return tr.file("b/rank1/region") }, numRules},
		{"relative path", func() string { return "a/region" }, RuleRelative},
		{"dot-dot back into the dir", func() string { return tr.path("a") + "/../a/region" }, RuleNotClean},
		{"dot-dot out of the dir", func() string { return tr.path("a") + "/../outside/secret" }, RuleNotClean},
		{"double slash", func() string { return tr.path("a") + "//region" }, RuleNotClean},
		{"outside every dir", func() string { return secret }, RuleOutsideDirs},
		{"a sibling sharing the dir's prefix", func() string { return tr.file("ab/region") }, RuleOutsideDirs},
		{"the dir itself", func() string { return tr.path("a") }, RuleOutsideDirs},
		{"etc passwd", func() string { return "/etc/passwd" }, RuleOutsideDirs},
		{"symlinked region dir", func() string { return tr.path("linkdir/region") }, RuleSymlink},
		{"symlinked file", func() string { return tr.symlink(secret, "a/link-to-secret") }, RuleSymlink},
		{"symlinked file to a file in the dir", func() string { return tr.symlink(inA, "a/link-to-region") }, RuleSymlink},
		{"symlink in a parent below the dir", func() string {
			tr.file("outside/sub/region")
			tr.symlink(tr.path("outside/sub"), "a/sub")
			return tr.path("a/sub/region")
		}, RuleSymlink},
		{"symlink in a parent above the dir", func() string {
			tr.file("realup/a/region")
			return tr.path("up/a/region")
		}, RuleSymlink},
		{"a directory", func() string {
			if err := os.Mkdir(tr.path("a/dir"), 0o755); err != nil {
				t.Fatal(err)
			}
			return tr.path("a/dir")
		}, RuleNotRegular},
		{"a fifo", func() string {
			if err := unix.Mkfifo(tr.path("a/fifo"), 0o600); err != nil {
				t.Fatal(err)
			}
			return tr.path("a/fifo")
		}, RuleNotRegular},
		{"a unix socket", func() string {
			ln, err := net.Listen("unix", tr.path("a/sock"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			return tr.path("a/sock")
		}, RuleNotRegular},
	}
	c, logs := newChecker(t, Config{Dirs: dirs})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path()
			before := c.Refused(tc.rule)
			logged := logs.Len()
			err := c.Check(path)
			if tc.rule == numRules {
				if err != nil {
					t.Fatalf("Check(%s) = %v, want accepted", path, err)
				}
				if logs.Len() != logged {
					t.Errorf("accepted path logged a refusal")
				}
				return
			}
			expectRefused(t, c, err, path, tc.rule, before)
			if logs.Len() != logged+1 {
				t.Fatalf("logged %d lines for the refusal, want 1", logs.Len()-logged)
			}
			line := logs.All()[logs.Len()-1]
			fields := line.ContextMap()
			if line.Message != "region path refused" || line.Level != zap.WarnLevel || fields["rule"] != tc.rule.String() || fields["path"] != path {
				t.Errorf("log line %q %v %v, want warn \"region path refused\" with rule %s and path %s", line.Message, line.Level, fields, tc.rule, path)
			}
		})
	}
}

func expectRefused(t *testing.T, c *Checker, err error, path string, rule Rule, before uint64) {
	t.Helper()
	var refused *RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("Check(%s) = %v, want refused by rule %s", path, err, rule)
	}
	if refused.Rule != rule {
		t.Fatalf("Check(%s) refused by rule %s (%v), want %s", path, refused.Rule, err, rule)
	}
	if msg := err.Error(); !strings.Contains(msg, "rule "+rule.String()) || !strings.Contains(msg, path) {
		t.Errorf("message %q does not name the rule %s and the path", msg, rule)
	}
	if got := c.Refused(rule); got != before+1 {
		t.Errorf("refused{rule=%s} = %d, want %d", rule, got, before+1)
	}
}

func TestRegionPathDeviceIsNotRegular(t *testing.T) {
	tr := newTree(t)
	dev := tr.path("a/null")
	if err := unix.Mknod(dev, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("cannot make a device node here (%v): needs root (CAP_MKNOD)", err)
	}
	c, _ := newChecker(t, Config{Dirs: []string{tr.path("a")}})
	expectRefused(t, c, c.Check(dev), dev, RuleNotRegular, 0)
}

func TestRegionPathGroupMustBeTheDaemons(t *testing.T) {
	tr := newTree(t)
	p := tr.file("a/region")
	t.Run("configured groups", func(t *testing.T) {
		c, _ := newChecker(t, Config{Dirs: []string{tr.path("a")}, Groups: []int{otherGID(t)}})
		expectRefused(t, c, c.Check(p), p, RuleGroup, 0)
	})
	t.Run("the process's groups", func(t *testing.T) {
		c, _ := newChecker(t, Config{Dirs: []string{tr.path("a")}})
		if err := c.Check(p); err != nil {
			t.Fatalf("a file of the daemon's own group refused: %v", err)
		}
		other := tr.file("a/other-group")
		if err := os.Chown(other, -1, otherGID(t)); err != nil {
			t.Skipf("cannot give a file a group the process is not in (%v): needs root", err)
		}
		expectRefused(t, c, c.Check(other), other, RuleGroup, 0)
	})
}

// A path that cannot be examined is an ordinary error, not a rule breach:
// nothing is counted.
func TestRegionPathMissingFileIsNotARefusal(t *testing.T) {
	tr := newTree(t)
	c, logs := newChecker(t, Config{Dirs: []string{tr.path("a")}})
	err := c.Check(tr.path("a/missing"))
	var refused *RefusedError
	if err == nil || errors.As(err, &refused) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Check(missing) = %v, want a not-exist error that is no refusal", err)
	}
	for _, r := range AllRules() {
		if c.Refused(r) != 0 {
			t.Errorf("refused{rule=%s} = %d after a missing file", r, c.Refused(r))
		}
	}
	if logs.Len() != 0 {
		t.Errorf("a missing file logged a refusal")
	}
}

// The race the final open closes: the path passes the Lstat walk, then
// (hook) its final component or a parent is swapped before the open. The
// open must not follow the swap: the fd's device and inode differ from
// the checked file's, and the path is refused as changed.
func TestRegionPathSwapBetweenCheckAndOpenIsRefused(t *testing.T) {
	swaps := []struct {
		name string
		swap func(tr tree, path string)
	}{
		{"final component to a symlink", func(tr tree, path string) {
			mustRemove(tr.t, path)
			tr.symlink(tr.path("outside/secret"), "a/sub/region")
		}},
		{"final component to another regular file", func(tr tree, path string) {
			other := tr.file("a/sub/other")
			if err := os.Rename(other, path); err != nil {
				tr.t.Fatal(err)
			}
		}},
		{"a parent to a symlink", func(tr tree, _ string) {
			if err := os.Rename(tr.path("a/sub"), tr.path("a/moved")); err != nil {
				tr.t.Fatal(err)
			}
			tr.file("outside/sub/region")
			tr.symlink(tr.path("outside/sub"), "a/sub")
		}},
	}
	for _, s := range swaps {
		t.Run(s.name, func(t *testing.T) {
			tr := newTree(t)
			tr.file("outside/secret")
			path := tr.file("a/sub/region")
			c, _ := newChecker(t, Config{Dirs: []string{tr.path("a")}})
			swapped := false
			c.beforeOpen = func(p string) {
				if p != path {
					t.Errorf("hook ran for %s, want %s", p, path)
				}
				s.swap(tr, p)
				swapped = true
			}
			err := c.Check(path)
			if !swapped {
				t.Fatal("the hook between the Lstat walk and the open never ran")
			}
			expectRefused(t, c, err, path, RuleChanged, 0)
		})
	}
}

func mustRemove(t *testing.T, p string) {
	t.Helper()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
}

func TestNewRefusesBadDirs(t *testing.T) {
	for _, dirs := range [][]string{nil, {"relative"}, {"/dev/shm/pdlink/"}, {"/dev/shm/../etc"}} {
		if _, err := New(Config{Dirs: dirs}); err == nil {
			t.Errorf("New(%q) accepted", dirs)
		}
	}
	if _, err := New(Config{Dirs: []string{"/dev/shm/pdlink", "/dev/shm/pdlink", "/"}}); err != nil {
		t.Errorf("New: %v", err)
	}
}

func TestRuleNamesAreTheClosedSet(t *testing.T) {
	want := "relative not_clean outside_dirs symlink not_regular group changed"
	var got []string
	for _, r := range AllRules() {
		got = append(got, r.String())
	}
	if strings.Join(got, " ") != want {
		t.Errorf("rules %v, want %s", got, want)
	}
}

// BenchmarkCheck is the cost RegisterRegion pays once per registration: a
// file five components deep (an Lstat each, then an open and an fstat).
func BenchmarkCheck(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "region")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	c, err := New(Config{Dirs: []string{dir}})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := c.Check(path); err != nil {
			b.Fatal(err)
		}
	}
}
