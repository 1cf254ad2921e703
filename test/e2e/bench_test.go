package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"
)

// pdctl bench --bytes-per-token sizes the simulated model's pages, so the
// small-room workload (one page, few bytes per token, many in flight) can
// be measured: 2 layers make 4 buffers, and 256 bytes per token over 4
// buffers and 16-token pages are 1 KiB pages.
func TestPdctlBenchBytesPerTokenSetsThePageSize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const requests, buffers, pageBytes = 8, 4, 256 / 4 * 16
	out, err := exec.CommandContext(ctx, bin("pdctl"), "bench", "--json", "--requests", "8", "--concurrency", "4",
		"--min-tokens", "16", "--max-tokens", "16", "--layers", "2", "--bytes-per-token", "256", "--pages", "16").Output()
	if err != nil {
		t.Fatalf("pdctl bench: %v\n%s", err, out)
	}
	var res struct {
		Requests  int   `json:"requests"`
		Buffers   int   `json:"buffers"`
		PageBytes int64 `json:"page_bytes"`
		Bytes     int64 `json:"bytes"`
		Failures  int   `json:"failures"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("pdctl bench --json printed %q: %v", out, err)
	}
	if res.Buffers != buffers || res.PageBytes != pageBytes {
		t.Errorf("bench ran %d buffers of %d-byte pages, want %d of %d", res.Buffers, res.PageBytes, buffers, pageBytes)
	}
	if res.Requests != requests || res.Failures != 0 || res.Bytes != requests*buffers*pageBytes {
		t.Errorf("bench moved %d bytes in %d requests with %d failures, want %d bytes, %d requests, none failed",
			res.Bytes, res.Requests, res.Failures, requests*buffers*pageBytes, requests)
	}
}
