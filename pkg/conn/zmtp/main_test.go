package zmtp

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(crashChildEnv); mode != "" {
		runCrashChild(mode) // never returns
	}
	goleak.VerifyTestMain(m)
}
