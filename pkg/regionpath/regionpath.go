package regionpath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Rule is one rule a region path must keep (doc.go lists them in order).
type Rule uint8

// The rules, in the order Check applies them.
const (
	RuleRelative Rule = iota
	RuleNotClean
	RuleOutsideDirs
	RuleSymlink
	RuleNotRegular
	RuleGroup
	RuleChanged
	numRules
)

var ruleNames = [numRules]string{"relative", "not_clean", "outside_dirs", "symlink", "not_regular", "group", "changed"}

func (r Rule) String() string {
	if r < numRules {
		return ruleNames[r]
	}
	return fmt.Sprintf("rule(%d)", uint8(r))
}

// AllRules is the closed set of rules, for exporting every counter at zero.
func AllRules() []Rule {
	out := make([]Rule, numRules)
	for i := range out {
		out[i] = Rule(i)
	}
	return out
}

// Config is what a Checker accepts.
type Config struct {
	// Dirs are the region directories (--region-dir): absolute, clean,
	// at least one.
	Dirs []string
	// Groups are the gids a region file may have; nil means the daemon's
	// own: its effective gid and its supplementary groups.
	Groups []int
	// Logger takes a warn line per refusal (nil: none).
	Logger *zap.Logger
}

// Checker applies the rules to a path; it counts and logs each refusal.
type Checker struct {
	dirs    []string
	groups  []uint32
	log     *zap.Logger
	refused [numRules]atomic.Uint64
	// beforeOpen (tests) runs after the Lstat walk, before the final
	// component is opened: the window a swap would use.
	beforeOpen func(path string)
}

// ValidateDir refuses a region directory that is not absolute and clean.
func ValidateDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return errors.New("must be an absolute path")
	}
	if filepath.Clean(dir) != dir {
		return fmt.Errorf("must be a clean path (%s)", filepath.Clean(dir))
	}
	return nil
}

// New returns a Checker for cfg's directories and groups.
func New(cfg Config) (*Checker, error) {
	if len(cfg.Dirs) == 0 {
		return nil, ErrNoDirs
	}
	c := &Checker{log: cfg.Logger}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	for _, d := range cfg.Dirs {
		if err := ValidateDir(d); err != nil {
			return nil, fmt.Errorf("region directory %q: %w", d, err)
		}
		if !slices.Contains(c.dirs, d) {
			c.dirs = append(c.dirs, d)
		}
	}
	groups := cfg.Groups
	if groups == nil {
		g, err := os.Getgroups()
		if err != nil {
			return nil, fmt.Errorf("read the daemon's groups: %w", err)
		}
		groups = append(g, os.Getegid())
	}
	for _, g := range groups {
		c.groups = append(c.groups, uint32(g))
	}
	return c, nil
}

// Dirs returns the region directories.
func (c *Checker) Dirs() []string { return slices.Clone(c.dirs) }

// Refused returns how many paths broke rule r.
func (c *Checker) Refused(r Rule) uint64 {
	if r >= numRules {
		return 0
	}
	return c.refused[r].Load()
}

// File is the file a check accepted: its device and inode.
type File struct{ Dev, Ino uint64 }

// Check accepts path or returns why not: a *RefusedError for a broken
// rule (counted and logged), another error when the path cannot be
// examined. An accepted path may still be replaced after Check returns:
// a caller that opens it again confirms it got the same file
// (CheckFile, Confirm).
func (c *Checker) Check(path string) error {
	_, err := c.CheckFile(path)
	return err
}

// CheckFile is Check, returning the file it accepted.
func (c *Checker) CheckFile(path string) (File, error) {
	f, err := c.check(path)
	c.count(path, err)
	return f, err
}

// Confirm refuses (RuleChanged) a file the caller opened at path after
// CheckFile accepted it, when the caller's file (dev, ino) is not the one
// accepted: the path was swapped between the check and the caller's open.
func (c *Checker) Confirm(path string, accepted File, dev, ino uint64) error {
	if accepted == (File{Dev: dev, Ino: ino}) {
		return nil
	}
	err := &RefusedError{Rule: RuleChanged, Path: path, Detail: fmt.Sprintf("replaced between the check and the open (inode %d, checked %d)", ino, accepted.Ino)}
	c.count(path, err)
	return err
}

func (c *Checker) count(path string, err error) {
	var refused *RefusedError
	if errors.As(err, &refused) {
		c.refused[refused.Rule].Add(1)
		c.log.Warn("region path refused", zap.String("path", path), zap.Stringer("rule", refused.Rule), zap.String("detail", refused.Detail))
	}
}

func (c *Checker) check(path string) (File, error) {
	refuse := func(r Rule, format string, args ...any) error {
		return &RefusedError{Rule: r, Path: path, Detail: fmt.Sprintf(format, args...)}
	}
	if !filepath.IsAbs(path) {
		return File{}, refuse(RuleRelative, "not an absolute path")
	}
	if clean := filepath.Clean(path); clean != path {
		return File{}, refuse(RuleNotClean, "not a clean path (it cleans to %s)", clean)
	}
	if !c.under(path) {
		return File{}, refuse(RuleOutsideDirs, "not under a region directory (%s)", strings.Join(c.dirs, ", "))
	}
	var st unix.Stat_t
	for _, p := range components(path) {
		if err := unix.Lstat(p, &st); err != nil {
			return File{}, &os.PathError{Op: "lstat", Path: p, Err: err}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return File{}, refuse(RuleSymlink, "%s is a symbolic link", p)
		}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return File{}, refuse(RuleNotRegular, "a %s, not a regular file", kind(st.Mode))
	}
	if !slices.Contains(c.groups, st.Gid) {
		return File{}, refuse(RuleGroup, "group %d is not one of the daemon's groups %v", st.Gid, c.groups)
	}
	if c.beforeOpen != nil {
		c.beforeOpen(path)
	}
	// O_PATH opens no file for I/O (no side effect on a device or fifo a
	// swap put there); O_NOFOLLOW opens a symlink swapped in as itself.
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return File{}, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var opened unix.Stat_t
	if err := unix.Fstat(fd, &opened); err != nil {
		return File{}, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	// The type and group are compared too: a file system may give a file
	// created in the window the inode number of the one it replaced.
	if opened.Dev != st.Dev || opened.Ino != st.Ino || opened.Mode != st.Mode || opened.Gid != st.Gid {
		return File{}, refuse(RuleChanged, "replaced between the check and the open (now a %s of group %d)", kind(opened.Mode), opened.Gid)
	}
	return File{Dev: uint64(st.Dev), Ino: st.Ino}, nil
}

// under reports whether path lies strictly below one of the directories.
func (c *Checker) under(path string) bool {
	for _, d := range c.dirs {
		if d == "/" && path != "/" || strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

// components lists "/" and every prefix of a clean absolute path that
// ends at a component: /a/b gives /, /a, /a/b.
func components(path string) []string {
	out := []string{"/"}
	for i := 1; i < len(path); i++ {
		if path[i] == '/' {
			out = append(out, path[:i])
		}
	}
	if path != "/" {
		out = append(out, path)
	}
	return out
}

func kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symbolic link"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	}
	return fmt.Sprintf("file of mode %#o", mode&unix.S_IFMT)
}
