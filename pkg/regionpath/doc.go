// Package regionpath decides which files a daemon may map as a KV region
// (issue 15). RegisterRegion comes from whoever can reach the scheduler
// socket; without this check that client could point the daemon at any
// file the daemon can open read-write, and read it out or write into it
// through the data plane.
//
// # Rules
//
// A path is accepted only if every rule holds, checked in this order; the
// first one broken is the refusal's Rule (a closed set, the rule label of
// pdlink_region_refused_total):
//
//  1. relative: the path is absolute.
//  2. not_clean: the path is clean (filepath.Clean leaves it unchanged, so
//     no "..", "." or "//").
//  3. outside_dirs: the path lies strictly under one of the configured
//     region directories (--region-dir).
//  4. symlink: no component from "/" to the file is a symbolic link, the
//     region directories themselves included (Lstat per component).
//  5. not_regular: the file is a regular file (no directory, fifo, socket
//     or device).
//  6. group: the file's group is one of the daemon's groups (its effective
//     gid or a supplementary one): the group the deployment gives the
//     engine (pdlink, set by the setgid region directory).
//  7. changed: the file opened is the one checked. The final component is
//     opened with O_PATH|O_NOFOLLOW after the walk and the opened fd's
//     device and inode must equal the Lstat's, so a swap to a symlink or to
//     another file between the check and the open is refused, not followed.
//
// A path that cannot be examined at all (a component missing, EACCES) is
// not a rule breach but an ordinary error: the caller answers it as it
// answers any unopenable region.
//
// # Usage
//
//	c, err := regionpath.New(regionpath.Config{Dirs: cfg.RegionDirs, Logger: log})
//	...
//	if err := c.Check(path); err != nil { /* refuse; errors.As(err, new(*regionpath.RefusedError)) */ }
//
// # Goroutines
//
// None. Check is safe for concurrent use: it holds no state but the
// refusal counters (atomics).
package regionpath
