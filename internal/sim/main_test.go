package sim

import (
	"testing"

	"go.uber.org/goleak"
)

// sendChunks starts a goroutine per prefill rank: none may outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
