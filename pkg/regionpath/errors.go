package regionpath

import (
	"errors"
	"fmt"
)

// ErrNoDirs means a Checker was configured with no region directory.
var ErrNoDirs = errors.New("regionpath: at least one region directory is required")

// RefusedError is a path that broke a rule: the edge answers it as
// PermissionDenied with this message, which names the rule and the path.
type RefusedError struct {
	Rule   Rule
	Path   string
	Detail string // what broke it, e.g. the symlinked component
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("region path %s refused (rule %s): %s", e.Path, e.Rule, e.Detail)
}
