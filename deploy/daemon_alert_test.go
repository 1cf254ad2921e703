package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// TestStalledSchedulerFiresOverdueAlertOnRealDaemons is the alert path end
// to end: the real prefilld and decoded on loopback, a real Prometheus
// scraping both every second with the deploy rules (for: cut to 2s). A
// decode scheduler opens rooms and then stalls (never sends metadata):
// the rooms pass half their bootstrap deadline on both daemons and
// PdlinkRoomsOverdue fires for each side. When the scheduler aborts the
// rooms, the alert resolves.
func TestStalledSchedulerFiresOverdueAlertOnRealDaemons(t *testing.T) {
	promBin := tool(t, "prometheus", "prometheus")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	bins := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", bins+"/", "../cmd/prefilld", "../cmd/decoded")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build daemons: %v\n%s", err, out)
	}
	// The alert fires about 2.5 s after the rooms are overdue (half their
	// deadline): the rooms' 16 s deadline leaves 5 s for a slow scrape,
	// where 8 s left 0.3 s and one failed scrape would have reset the
	// alert's pending timer until the rooms timed out.
	deadlines := []string{"--bootstrap-timeout=16s", "--waiting-timeout=16s", "--heartbeat-interval=200ms"}
	regions := t.TempDir() // the engines' regions: the daemons' --region-dir
	start := func(name string, extra ...string) *proc.Process {
		args := append([]string{"--grpc-listen=unix://" + filepath.Join(t.TempDir(), name+".sock"),
			"--http-listen=127.0.0.1:0", "--region-dir=" + regions}, append(extra, deadlines...)...)
		p, err := proc.Start(ctx, filepath.Join(bins, name), args, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
		return p
	}
	pre := start("prefilld", "--bootstrap-listen=tcp://127.0.0.1:0")
	dec := start("decoded", "--data-listen=127.0.0.1:0")
	bootstrap := pre.LogField("bootstrap socket bound", "addr")

	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: [pdlink.rules.yml]
scrape_configs:
  - job_name: pdlink-prefill
    static_configs: [{targets: [%q]}]
  - job_name: pdlink-decode
    static_configs: [{targets: [%q]}]
`, pre.HTTPAddr, dec.HTTPAddr)
	for name, b := range map[string][]byte{"prometheus.yml": []byte(cfg), "pdlink.rules.yml": fastRules(t)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	api, _, _ := startPrometheus(ctx, t, promBin, dir)
	eventually(ctx, t, "prometheus scraping both daemons", func() (bool, error) {
		var res struct {
			Result []json.RawMessage `json:"result"`
		}
		err := api.get(ctx, "/api/v1/query", url.Values{"query": {`up{job=~"pdlink-.*"} == 1`}}, &res)
		return err == nil && len(res.Result) == 2, err
	})

	// The decode engine's memory, registered so rooms can open.
	layout := transfer.UniformLayout(2, 16, 4096, 4, 64)
	region, err := transfer.CreateRegionFile(regions, layout)
	if err != nil {
		t.Fatal(err)
	}
	dconn, err := grpc.NewClient("unix://"+dec.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer dconn.Close()
	pconn, err := grpc.NewClient("unix://"+pre.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close()
	decode, prefill := pb.NewDecodeServiceClient(dconn), pb.NewPrefillServiceClient(pconn)
	lp := &pb.RegionLayout{Rank: &pb.Rank{TpSize: 1}, Aux: &pb.AuxSpec{Offset: uint64(layout.Aux.Offset), RowLen: 64, Rows: 4}}
	for _, b := range layout.Buffers {
		lp.Buffers = append(lp.Buffers, &pb.BufferSpec{Offset: uint64(b.Offset), Length: uint64(b.Length), ItemLen: uint32(b.ItemLen)})
	}
	if _, err := decode.RegisterRegion(ctx, &pb.DecodeServiceRegisterRegionRequest{RegionPath: region, Layout: lp}); err != nil {
		t.Fatal(err)
	}

	firing := func(side string) func() (bool, error) {
		return func() (bool, error) {
			as, err := api.alerts(ctx, "PdlinkRoomsOverdue")
			for _, a := range as {
				if a.Labels["side"] == side && a.State == "firing" {
					return true, nil
				}
			}
			return false, err
		}
	}
	// Healthy first: nothing overdue.
	if ok, _ := firing("decode")(); ok {
		t.Fatal("PdlinkRoomsOverdue firing before any room")
	}

	// A decode scheduler that opens rooms and stalls: it never sends
	// metadata. Prefill's scheduler opened its side too.
	rooms := []uint64{101, 102, 103}
	for _, r := range rooms {
		if _, err := prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: r}); err != nil {
			t.Fatal(err)
		}
		if _, err := decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: r, PrefillBootstrapAddr: bootstrap}); err != nil {
			t.Fatal(err)
		}
	}
	opened := time.Now()
	eventually(ctx, t, "PdlinkRoomsOverdue firing for decode", firing("decode"))
	eventually(ctx, t, "PdlinkRoomsOverdue firing for prefill", firing("prefill"))
	if since := time.Since(opened); since < 8*time.Second {
		t.Fatalf("alert fired after %v, before the rooms were overdue (8s of a 16s deadline)", since)
	}
	// The pin alert must not fire: the reaper works, nothing passed its
	// deadline yet.
	if as, _ := api.alerts(ctx, "PdlinkRoomPastDeadline"); len(as) > 0 {
		t.Fatalf("PdlinkRoomPastDeadline: %+v", as)
	}

	// The scheduler recovers and aborts its rooms: nothing is overdue, the
	// alert resolves (before the rooms' own deadline would have ended them).
	for _, r := range rooms {
		if _, err := decode.Abort(ctx, &pb.DecodeServiceAbortRequest{RoomId: r}); err != nil {
			t.Fatal(err)
		}
		if _, err := prefill.Abort(ctx, &pb.PrefillServiceAbortRequest{RoomId: r}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(ctx, t, "PdlinkRoomsOverdue resolved", func() (bool, error) {
		as, err := api.alerts(ctx, "PdlinkRoomsOverdue")
		return err == nil && len(as) == 0, err
	})
}
