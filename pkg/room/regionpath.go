package room

import (
	"errors"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/regionpath"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// newRegionPaths is the checker of the owner's region directories (nil
// when none is configured: then every path is refused).
func newRegionPaths(dirs []string, log *zap.Logger) (*regionpath.Checker, error) {
	if len(dirs) == 0 {
		return nil, nil
	}
	return regionpath.New(regionpath.Config{Dirs: dirs, Logger: log})
}

// checkRegionPath refuses a path that is no file a region may be
// (ErrRegionPathRefused naming the rule and the path), before the region
// is opened. A path it cannot examine is a region_path FieldError, as an
// unopenable region is.
func checkRegionPath(paths *regionpath.Checker, path string) (regionpath.File, error) {
	if paths == nil {
		return regionpath.File{}, errorf(ErrRegionPathRefused, "region path %s refused: no region directory is configured", path)
	}
	f, err := paths.CheckFile(path)
	return f, regionPathError(err)
}

// confirmRegionPath refuses a mapped file that is not the one
// checkRegionPath accepted (the path was swapped between the two opens).
func confirmRegionPath(paths *regionpath.Checker, path string, accepted regionpath.File, mapped transfer.RegionID) error {
	return regionPathError(paths.Confirm(path, accepted, mapped.Dev, mapped.Ino))
}

func regionPathError(err error) error {
	var refused *regionpath.RefusedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &refused):
		return errorf(ErrRegionPathRefused, "%v", refused)
	default:
		return invalid("region_path", "%v", err)
	}
}

// regionRefused is how many region paths broke rule r.
func regionRefused(paths *regionpath.Checker, r regionpath.Rule) uint64 {
	if paths == nil {
		return 0
	}
	return paths.Refused(r)
}

// RegionRefused is how many RegisterRegion paths broke rule r
// (pdlink_region_refused_total).
func (n *PrefillOwner) RegionRefused(r regionpath.Rule) uint64 {
	if n.data == nil {
		return 0
	}
	return regionRefused(n.data.slot.paths, r)
}

// RegionRefused is how many RegisterRegion paths broke rule r
// (pdlink_region_refused_total).
func (n *DecodeOwner) RegionRefused(r regionpath.Rule) uint64 {
	if n.data == nil {
		return 0
	}
	return regionRefused(n.data.slot.paths, r)
}
