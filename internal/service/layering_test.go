package service

import (
	"os/exec"
	"strings"
	"testing"
)

// The service is the gRPC edge only (issue 12): the room owner drives the
// data plane, so internal/service never names pkg/transfer. Its own
// imports are checked, not -deps: pkg/room, which it calls, drives
// transfer (docs/history/room-PLAN.md section 1), and internal/daemon's config names the
// transport's kind.
func TestServiceDoesNotImportTransfer(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, "github.com/pdlink/pdlink/internal/service").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, imp := range strings.Fields(string(out)) {
		if imp == "github.com/pdlink/pdlink/pkg/transfer" || strings.HasPrefix(imp, "github.com/pdlink/pdlink/pkg/transfer/") {
			t.Errorf("internal/service imports %s: the data plane is the room owner's", imp)
		}
	}
}
