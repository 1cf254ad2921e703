package e2e

import (
	"context"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/sim"
)

// pdctl watch streams transitions from either daemon and pdctl rooms
// lists a live room with its state.
func TestPdctlWatchAndRooms(t *testing.T) {
	pre, dec, cfg := pairProcs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var watchers []*exec.Cmd
	var outs []*syncBuilder
	for _, p := range []string{pre.GRPCAddr, dec.GRPCAddr} {
		cmd := exec.CommandContext(ctx, bin("pdctl"), "watch", "--addr", "unix://"+p, "--for", "4s")
		out := &syncBuilder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		watchers, outs = append(watchers, cmd), append(outs, out)
	}
	for _, o := range outs { // each watcher says when it is subscribed
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(o.String(), "watching ") {
			if time.Now().After(deadline) {
				t.Fatalf("pdctl watch never subscribed: %s", o)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	cfg.Requests, cfg.Concurrency = 5, 2
	rep, err := sim.Run(ctx, cfg)
	if err != nil || rep.Outcomes["decode:success"] != 5 {
		t.Fatalf("sim: %v %v", rep, err)
	}
	for i, w := range watchers {
		if err := w.Wait(); err != nil {
			t.Fatalf("pdctl watch: %v\n%s", err, outs[i])
		}
		if !strings.Contains(outs[i].String(), "-> success") {
			t.Errorf("pdctl watch saw no success:\n%s", outs[i])
		}
	}

	conn, err := grpc.NewClient("unix://"+pre.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pb.NewPrefillServiceClient(conn).OpenSender(ctx, &pb.OpenSenderRequest{RoomId: 777}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin("pdctl"), "rooms", "--addr", "unix://"+pre.GRPCAddr, "--state", "bootstrapping").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "777") || !strings.Contains(string(out), "bootstrapping") || !strings.Contains(string(out), "1 rooms") {
		t.Fatalf("pdctl rooms: %v\n%s", err, out)
	}
}

// syncBuilder is a strings.Builder safe for a writer process and a reader.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
