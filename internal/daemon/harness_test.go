package daemon

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// runServer runs s until the test ends (then it must return nil within
// 10 s) and returns a channel that yields Run's result. It waits until s
// is ready, so SIGHUP is already taken.
func runServer(t *testing.T, s *Server) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after stop")
		}
	})
	waitFor(t, s.Ready)
	return done
}

// runReturnsNil waits (bounded) for Run's result and fails the test
// unless it is nil.
func runReturnsNil(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

// heldDrainConfig is testConfig with a drain timeout long enough that a
// drain held by holdDrain never meets the stop bound (Run would return
// ErrStopTimeout).
func heldDrainConfig(t *testing.T) Config {
	cfg := testConfig(t)
	cfg.DrainTimeout = time.Minute
	return cfg
}

// holdDrain makes s's drain wait: draining is closed when the drain
// starts, which then lasts until endDrain is closed.
func holdDrain(s *Server) (draining, endDrain chan struct{}) {
	draining, endDrain = make(chan struct{}), make(chan struct{})
	s.OnDrain(func(context.Context, time.Time) { close(draining); <-endDrain })
	return draining, endDrain
}

// addSlowComponent adds a component that turns ready only once release
// is closed, and stops when the server stops it.
func addSlowComponent(s *Server) (release chan struct{}) {
	release = make(chan struct{})
	stop := make(chan struct{})
	s.Add("slow", func(ready func()) error {
		<-release
		ready()
		<-stop
		return nil
	}, func(error) { close(stop) })
	return release
}

func scrape(t *testing.T, s *Server) string {
	t.Helper()
	_, body := get(t, "http://"+s.HTTPAddr().String()+"/metrics")
	return body
}

// healthClient dials s's gRPC listener, a unix socket or TCP, without
// TLS; the connection closes when the test ends.
func healthClient(t *testing.T, s *Server) healthpb.HealthClient {
	t.Helper()
	target := "passthrough:///" + s.GRPCAddr().String()
	if s.GRPCAddr().Network() == "unix" {
		target = "unix://" + s.GRPCAddr().String()
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func checkHealth(t *testing.T, hc healthpb.HealthClient, name string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
	return resp.GetStatus(), err
}
