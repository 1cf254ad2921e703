package service

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// Issue 15: a scheduler client can point RegisterRegion only at a file
// under the daemon's --region-dir. Anything else is PermissionDenied with
// the rule and the path in the message, a warn line, and one more
// pdlink_region_refused_total{rule} on that side; a file in the directory
// is still accepted.
func TestRegisterRegionOutsideTheRulesIsPermissionDenied(t *testing.T) {
	regions := t.TempDir()
	core, logs := observer.New(zap.WarnLevel)
	p := startPairLoggingTo(t, zap.New(core), func(pre, dec *daemon.Config) {
		pre.RegionDirs, dec.RegionDirs = []string{regions}, []string{regions}
	})
	l := transfer.UniformLayout(4, 64, 4096, 8, 64)
	inside, err := transfer.CreateRegionFile(regions, l)
	if err != nil {
		t.Fatal(err)
	}
	outside, err := transfer.CreateRegionFile(t.TempDir(), l)
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(regions, "link-to-outside")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	sides := []struct {
		name     string
		http     string
		register func(ctx context.Context, path string) error
	}{
		{"prefill", p.preHTTP, func(ctx context.Context, path string) error {
			_, err := p.prefill.RegisterRegion(ctx, &pb.PrefillServiceRegisterRegionRequest{RegionPath: path, Layout: layoutPB(l)})
			return err
		}},
		{"decode", p.decHTTP, func(ctx context.Context, path string) error {
			_, err := p.decode.RegisterRegion(ctx, &pb.DecodeServiceRegisterRegionRequest{RegionPath: path, Layout: layoutPB(l)})
			return err
		}},
	}
	for _, side := range sides {
		for _, tc := range []struct{ path, rule string }{
			{outside, "outside_dirs"},
			{"/etc/passwd", "outside_dirs"},
			{link, "symlink"},
			{regions + "/../" + filepath.Base(outside), "not_clean"},
		} {
			counter := `pdlink_region_refused_total{rule="` + tc.rule + `"`
			before := metric(t, side.http, counter)
			logged := logs.FilterMessage("region path refused").Len()
			err := side.register(ctxT(t), tc.path)
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "rule "+tc.rule) || !strings.Contains(err.Error(), tc.path) {
				t.Errorf("%s: RegisterRegion(%s) = %v, want PermissionDenied naming rule %s and the path", side.name, tc.path, err, tc.rule)
			}
			if after := metric(t, side.http, counter); number(t, after) != number(t, before)+1 {
				t.Errorf("%s: %s} %s -> %s after refusing %s, want one more", side.name, counter, before, after, tc.path)
			}
			if n := logs.FilterMessage("region path refused").Len(); n != logged+1 {
				t.Errorf("%s: %d warn lines for refusing %s, want 1", side.name, n-logged, tc.path)
			}
		}
		if err := side.register(ctxT(t), inside); err != nil {
			t.Errorf("%s: RegisterRegion of a region in --region-dir: %v", side.name, err)
		}
	}
}

// number is a sample value of /metrics.
func number(t *testing.T, v string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("sample value %q: %v", v, err)
	}
	return f
}
