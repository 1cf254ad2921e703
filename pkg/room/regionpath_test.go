package room

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/regionpath"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// tempRegionDirs are the region directories of tests whose regions are
// made by newRegion (under t.TempDir, so under os.TempDir).
func tempRegionDirs() []string { return []string{filepath.Clean(os.TempDir())} }

// allowTempRegions lets a bare data plane's slot register test regions.
func allowTempRegions(t testing.TB, s *regionSlot) {
	t.Helper()
	paths, err := newRegionPaths(tempRegionDirs(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	s.paths = paths
}

// RegisterRegion checks the path before it opens the file: a refused
// path maps nothing and is counted by rule, and a slot with no region
// directory refuses every path.
func TestRegisterRegionRefusesAPathBeforeOpeningIt(t *testing.T) {
	dir := t.TempDir()
	l := transfer.UniformLayout(4, 64, 4096, 8, 64)
	inside, err := transfer.CreateRegionFile(dir, l)
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(inside, link); err != nil {
		t.Fatal(err)
	}
	d := newDecodeData(transfer.KindTCP, transfer.ReceiverConfig{}, zap.NewNop(), nil)
	defer d.Close()
	if _, err := d.slot.register(inside, layoutPB(l)); !errors.Is(err, ErrRegionPathRefused) {
		t.Fatalf("register with no region directory: %v, want ErrRegionPathRefused", err)
	}
	paths, err := newRegionPaths([]string{dir}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	d.slot.paths = paths
	_, err = d.slot.register(link, layoutPB(l))
	if !errors.Is(err, ErrRegionPathRefused) || !strings.Contains(err.Error(), "rule symlink") || !strings.Contains(err.Error(), link) {
		t.Fatalf("register of a symlink: %v, want ErrRegionPathRefused naming rule symlink and %s", err, link)
	}
	if d.slot.get() != nil {
		t.Fatal("a refused path was mapped")
	}
	if got := regionRefused(d.slot.paths, regionpath.RuleSymlink); got != 1 {
		t.Fatalf("refused{rule=symlink} = %d, want 1", got)
	}
	var field *FieldError
	if _, err := d.slot.register(filepath.Join(dir, "missing"), layoutPB(l)); !errors.As(err, &field) || field.Field != "region_path" {
		t.Fatalf("register of a missing file: %v, want a region_path FieldError", err)
	}
	if _, err := d.slot.register(inside, layoutPB(l)); err != nil {
		t.Fatalf("register of a region inside the directory: %v", err)
	}
}

// The path check opens the path, and the mapping opens it again: a file
// swapped in between (here one outside every region directory, moved in
// over the checked one) is refused, not mapped.
func TestRegisterRegionRefusesAFileSwappedInAfterTheCheck(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	l := transfer.UniformLayout(4, 64, 4096, 8, 64)
	checked, err := transfer.CreateRegionFile(dir, l)
	if err != nil {
		t.Fatal(err)
	}
	other, err := transfer.CreateRegionFile(outside, l)
	if err != nil {
		t.Fatal(err)
	}
	d := newDecodeData(transfer.KindTCP, transfer.ReceiverConfig{}, zap.NewNop(), nil)
	defer d.Close()
	if d.slot.paths, err = newRegionPaths([]string{dir}, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	d.slot.afterPathCheck = func(path string) {
		if err := os.Rename(other, path); err != nil {
			t.Errorf("swap: %v", err)
		}
	}
	_, err = d.slot.register(checked, layoutPB(l))
	if !errors.Is(err, ErrRegionPathRefused) || !strings.Contains(err.Error(), "rule changed") {
		t.Fatalf("register of a file swapped after the check: %v, want ErrRegionPathRefused naming rule changed", err)
	}
	if d.slot.get() != nil {
		t.Fatal("the swapped-in file was mapped")
	}
	if got := regionRefused(d.slot.paths, regionpath.RuleChanged); got != 1 {
		t.Fatalf("refused{rule=changed} = %d, want 1", got)
	}
}
