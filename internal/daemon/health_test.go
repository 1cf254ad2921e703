package daemon

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// fakeService registers a service by name only: the health service reads
// names from the gRPC server, not from handlers.
func fakeService(s *Server, name string) {
	s.GRPC.RegisterService(&grpc.ServiceDesc{ServiceName: name, HandlerType: (*any)(nil)}, struct{}{})
}

// wantHealth checks "" and every served name answer want.
func wantHealth(t *testing.T, hc healthpb.HealthClient, want healthpb.HealthCheckResponse_ServingStatus, names ...string) {
	t.Helper()
	for _, name := range append([]string{""}, names...) {
		if st, err := checkHealth(t, hc, name); err != nil || st != want {
			t.Errorf("health %q = %v, %v; want %v", name, st, err, want)
		}
	}
}

// A probe that asks by service name (grpc_health_probe -service=...) gets
// the same answer as one asking for "", through readiness and drain, on
// Check and on Watch; an unknown name stays NotFound. Before, every name
// answered NotFound.
func TestHealthByServiceNameFollowsReadinessAndDrain(t *testing.T) {
	const svc, admin = "pdlink.v1.PrefillService", "pdlink.v1.AdminService"
	s, err := NewServer(heldDrainConfig(t), zap.NewNop(), "test")
	if err != nil {
		t.Fatal(err)
	}
	fakeService(s, svc)
	fakeService(s, admin)
	release := addSlowComponent(s)
	draining, endDrain := holdDrain(s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	hc := healthClient(t, s)
	waitFor(t, func() bool { _, err := checkHealth(t, hc, svc); return err == nil })
	wantHealth(t, hc, healthpb.HealthCheckResponse_NOT_SERVING, svc, admin)
	for _, name := range []string{"pdlink.v1.NoSuchService", "grpc.health.v1.Health", "PrefillService"} {
		if _, err := checkHealth(t, hc, name); status.Code(err) != codes.NotFound {
			t.Errorf("health %q = %v; want NotFound", name, err)
		}
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	watch, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	nextWatched := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for {
			resp, err := watch.Recv()
			if err != nil {
				t.Fatalf("health watch %q: %v while waiting for %v", svc, err, want)
			}
			if resp.Status == want {
				return
			}
		}
	}
	nextWatched(healthpb.HealthCheckResponse_NOT_SERVING)

	close(release)
	nextWatched(healthpb.HealthCheckResponse_SERVING)
	wantHealth(t, hc, healthpb.HealthCheckResponse_SERVING, svc, admin)

	cancel()
	<-draining
	nextWatched(healthpb.HealthCheckResponse_NOT_SERVING)
	wantHealth(t, hc, healthpb.HealthCheckResponse_NOT_SERVING, svc, admin)
	close(endDrain)
	runReturnsNil(t, done)
}

// A component that turns ready only after SIGTERM must not bring the
// health service back to SERVING in the middle of the drain.
func TestComponentReadyDuringDrainKeepsHealthNotServing(t *testing.T) {
	const svc = "pdlink.v1.DecodeService"
	core, logs := observer.New(zap.InfoLevel)
	s, err := NewServer(heldDrainConfig(t), zap.New(core), "test")
	if err != nil {
		t.Fatal(err)
	}
	fakeService(s, svc)
	release := addSlowComponent(s)
	draining, endDrain := holdDrain(s)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	cancel()
	<-draining
	close(release)
	waitFor(t, func() bool {
		return logs.FilterMessage("components ready after the drain started: staying not serving").Len() == 1 ||
			logs.FilterMessage("serving").Len() == 1
	})
	hc := healthClient(t, s)
	wantHealth(t, hc, healthpb.HealthCheckResponse_NOT_SERVING, svc)
	if s.Ready() {
		t.Error("/readyz ready during the drain")
	}
	close(endDrain)
	runReturnsNil(t, done)
}
