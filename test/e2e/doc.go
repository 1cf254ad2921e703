// Package e2e runs the real pdlink binaries as child processes on loopback
// and checks what an operator would: they start, serve, report health, and
// stop cleanly. TestMain builds the binaries once into a temporary
// directory; each test owns the processes it starts and stops them.
package e2e
