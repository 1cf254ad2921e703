package daemon

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
)

// After SIGTERM a daemon exits within --drain-timeout + StopBound whatever
// happens: a drain hook that overruns its cap (a fence that never
// completes) or a component that does not stop when interrupted (a data
// plane Close stuck behind it) is left behind, and Run says so with
// ErrStopTimeout. Before, Run waited for them for good.
func TestRunReturnsWithinTheStopBoundWhenTheDrainOrAComponentHangs(t *testing.T) {
	for _, hang := range []string{"drain", "component"} {
		t.Run(hang, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.DrainTimeout = 200 * time.Millisecond
			s, err := NewServer(cfg, zap.NewNop(), "test")
			if err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			// Released once Run returned, so nothing outlives the test.
			defer close(release)
			drainCap := make(chan time.Time, 1)
			switch hang {
			case "drain":
				s.OnDrain(func(ctx context.Context, _ time.Time) {
					capAt, _ := ctx.Deadline()
					drainCap <- capAt
					<-release
				})
			case "component":
				s.Add("stuck", func(ready func()) error {
					ready()
					<-release
					return nil
				}, func(error) {})
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			waitFor(t, s.Ready)

			sigterm := time.Now()
			cancel()
			select {
			case err := <-done:
				took := time.Since(sigterm)
				t.Logf("Run returned %v after the stop: %v", took.Round(time.Millisecond), err)
				if !errors.Is(err, ErrStopTimeout) {
					t.Errorf("Run = %v, want ErrStopTimeout", err)
				}
				if took > cfg.DrainTimeout+StopBound {
					t.Errorf("Run returned %v after the stop, want within drain timeout %v + %v", took, cfg.DrainTimeout, StopBound)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return with a stuck " + hang)
			}
			if hang == "drain" {
				if capAt := <-drainCap; capAt.Sub(sigterm) > cfg.DrainTimeout+StopBound {
					t.Errorf("the drain's cap is %v after the stop, past the bound", capAt.Sub(sigterm))
				}
			}
		})
	}
}
