// Package e2e runs the real pdlink binaries as child processes on loopback
// and checks what an operator would: they start, serve, report health, and
// stop cleanly. TestMain builds the binaries once into a temporary
// directory; each test owns the processes it starts and stops them.
//
// owner_bugs_test.go holds the user-visible defects of issue 12, each a
// test of the fixed behaviour built to reproduce the defect by
// construction; all of them run (they were skipped as "BUG (issue 12)"
// until their fix landed).
package e2e
