// Package loglimit lets one log line per reason through per interval and counts the lines
// it held back, so that a peer sending nothing but bad input cannot flood a daemon's log.
// A Limiter is safe for concurrent use and starts no goroutine; its clock is injected.
package loglimit
