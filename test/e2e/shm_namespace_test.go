package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestShmDecodeInAnotherMountNamespaceFallsBackToTCP: decoded runs in a
// mount namespace of its own with a private tmpfs over the prefill region's
// directory and a file of the same size at the prefill file's path, as a
// pod whose "shared" volume is not the prefill pod's would see it: the path
// opens, but it is another file. Decode refuses the offer on identity
// (device and inode), logs it and counts it on both sides, and the room
// still succeeds with every byte right, over TCP. (pkg/transfer's
// TestShmFallsBackToTCPWhenDecodeCannotProveTheFile covers a path decode
// cannot open, in one process.)
func TestShmDecodeInAnotherMountNamespaceFallsBackToTCP(t *testing.T) {
	if out, err := exec.Command("unshare", "--mount", "--propagation", "private", "true").CombinedOutput(); err != nil {
		t.Skipf("cannot create a mount namespace here (unshare --mount: %v: %s)", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// $1 the directory to hide, $2 the size, $3 the path of the other
	// file; then exec decoded, so the process started is the daemon.
	const script = `mount -t tmpfs pdlink-decode-ns "$1" && truncate -s "$2" "$3" && shift 3 && exec "$@"`
	pl := pairPlacement{srcDir: regionDir(t), dstDir: regionDir(t), decWrap: func(srcPath string) []string {
		return []string{"unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
			filepath.Dir(srcPath), strconv.FormatInt(streamLayout.Size(), 10), srcPath}
	}}
	auto := transportArgs("auto")
	p := &restartPair{newOwnerPairPlaced(t, streamLayout, streamLayout, auto, auto, pl), ctx}
	p.moveRoom(1, 0)
	p.moveRoom(2, 1)

	if got := p.dec.LogField("same-host pages refused, tcp for this rank", "reason"); got != "identity" {
		t.Errorf("decoded's refusal log names reason %q, want identity; logs:\n%s", got, p.dec.Logs())
	}
	for side, addr := range map[string]string{"prefill": p.pre.HTTPAddr, "decode": p.dec.HTTPAddr} {
		if n := metric(t, addr, `pdlink_shm_fallback_total{reason="identity",side="`+side+`"}`); n < 1 {
			t.Errorf(`pdlink_shm_fallback_total{reason="identity"} on %s: %v, want at least 1`, side, n)
		}
		if n := metric(t, addr, `pdlink_shm_accepted_total{side="`+side+`"}`); n != 0 {
			t.Errorf("pdlink_shm_accepted_total on %s: %v, want 0: decode cannot have proven another namespace's file", side, n)
		}
	}
	if n := metric(t, p.dec.HTTPAddr, `pdlink_shm_copied_bytes_total{side="decode"}`); n != 0 {
		t.Errorf("pdlink_shm_copied_bytes_total: %v, want 0 (every page over TCP)", n)
	}
}
