package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/internal/testbed"
)

// pdctl watch streams transitions from either daemon until interrupted
// (or for --for), and pdctl rooms lists a live room with its state.
func TestPdctlWatchAndRooms(t *testing.T) {
	pre, dec, cfg := pairProcs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// --for ends a watch on its own and that is a clean exit.
	if out, err := exec.CommandContext(ctx, bin("pdctl"), "watch", "--addr", "unix://"+pre.GRPCAddr, "--for", "200ms").CombinedOutput(); err != nil {
		t.Fatalf("pdctl watch --for 200ms: %v\n%s", err, out)
	}

	// The watchers run until they saw the rooms succeed, then are
	// interrupted: a --for window would start at the process start, and on
	// a loaded machine the rooms could end after it.
	var watchers []*exec.Cmd
	var outs []*syncBuilder
	for _, p := range []string{pre.GRPCAddr, dec.GRPCAddr} {
		cmd := exec.CommandContext(ctx, bin("pdctl"), "watch", "--addr", "unix://"+p)
		out := &syncBuilder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		watchers, outs = append(watchers, cmd), append(outs, out)
	}
	waitOutput := func(o *syncBuilder, what, want string) {
		t.Helper()
		if _, ok := testbed.Eventually(20*time.Second, func() bool { return strings.Contains(o.String(), want) }); !ok {
			t.Fatalf("pdctl watch %s within 20s:\n%s", what, o)
		}
	}
	for _, o := range outs { // each watcher says when it is subscribed
		waitOutput(o, "never subscribed", "watching ")
	}
	cfg.Requests, cfg.Concurrency = 5, 2
	rep, err := sim.Run(ctx, cfg)
	if err != nil || rep.Outcomes["decode:success"] != 5 {
		t.Fatalf("sim: %v %v", rep, err)
	}
	for i, w := range watchers {
		waitOutput(outs[i], "saw no success", "-> success")
		if err := w.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		if err := w.Wait(); err != nil {
			t.Fatalf("pdctl watch after an interrupt: %v\n%s", err, outs[i])
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
