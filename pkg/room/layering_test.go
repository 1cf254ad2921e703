package room

import (
	"os/exec"
	"strings"
	"testing"
)

// The link does not know its owner (DESIGN section 3: conn and transfer
// import neither the owner nor the services): pkg/conn reaches the room
// side only through the conn.RoomSide it is given.
func TestConnDoesNotImportTheOwner(t *testing.T) {
	for _, pkg := range []string{"github.com/pdlink/pdlink/pkg/conn", "github.com/pdlink/pdlink/pkg/conn/zmtp", "github.com/pdlink/pdlink/pkg/transfer"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == "github.com/pdlink/pdlink/pkg/room" || strings.HasPrefix(dep, "github.com/pdlink/pdlink/internal/") {
				t.Errorf("%s imports %s", pkg, dep)
			}
		}
	}
}
