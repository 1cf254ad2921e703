package service

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// One query finds a room's lines: on both daemons, along a TP 2 room's
// path to Success, another's aborted in the middle of its transfer and a
// third's failed by one rank's engine restart,
// every log entry with a room field has the room's id there as a number,
// its nonce (a number) and rank ("tp/size") in fields of their own, and
// no entry names a nonce without its room.
func TestEveryLogLineAboutARoomHasItsIDAsANumber(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	p := startMappedPairLoggingTo(t, zap.New(core), 2, 2, func(transfer.Rank) transfer.Layout { return newRegion(t).layout }, nil)
	src := func(rank int) []int32 { return []int32{int32(3 + rank), 20} }
	dst := func(rank int) []int32 { return []int32{int32(50 + rank), 9} }
	const done, aborted, replaced = 77, 78, 79
	p.moveRoom(t, done, src, dst)

	p.openEveryRank(t, aborted)
	for i := range p.dec {
		p.metaRank(t, aborted, i, dst(i))
	}
	p.waitPrefill(t, aborted, pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: aborted, Rank: tpRank(0, 2), Pages: &pb.PageList{Indices: src(0)[:1]}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.Abort(ctxT(t), &pb.DecodeServiceAbortRequest{RoomId: aborted}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the aborted room Failed on both sides", func() bool {
		ps, ds := pollState(t, p.pair, aborted)
		return ps.State == pb.RoomState_ROOM_STATE_FAILED && ds.State == pb.RoomState_ROOM_STATE_FAILED
	})
	// A room failed by an engine restart mid-room: prefill rank 1's new
	// generation fails it region_replaced on both sides.
	p.openEveryRank(t, replaced)
	for i := range p.dec {
		p.metaRank(t, replaced, i, dst(i))
	}
	p.waitPrefill(t, replaced, pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	if _, failed := p.reregister(t, false, 1); failed != 1 {
		t.Fatalf("prefill rank 1's new generation failed %d rooms, want 1", failed)
	}
	eventually(t, "the replaced room Failed on both sides", func() bool {
		ps, ds := pollState(t, p.pair, replaced)
		return ps.State == pb.RoomState_ROOM_STATE_FAILED && ds.State == pb.RoomState_ROOM_STATE_FAILED
	})
	p.stop(t) // every line written: the daemons' last ones are about rooms too

	type side struct {
		rooms        map[uint64]bool
		ranked, msgs map[string]bool
	}
	sides := map[string]*side{}
	for _, e := range logs.All() {
		f := e.ContextMap()
		v, ok := f["room"]
		if !ok {
			if n, ok := f["nonce"]; ok {
				t.Errorf("%s %q: nonce %v without the room (fields %v)", e.LoggerName, e.Message, n, f)
			}
			continue
		}
		daemonName, _, _ := strings.Cut(e.LoggerName, ".")
		s := sides[daemonName]
		if s == nil {
			s = &side{rooms: map[uint64]bool{}, ranked: map[string]bool{}, msgs: map[string]bool{}}
			sides[daemonName] = s
		}
		s.msgs[e.Message] = true
		id, ok := v.(uint64)
		if !ok {
			t.Errorf("%s %q: room is %T %v, want the id as a number (fields %v)", e.LoggerName, e.Message, v, v, f)
			continue
		}
		s.rooms[id] = true
		if n, ok := f["nonce"]; ok {
			if _, ok := n.(uint64); !ok {
				t.Errorf("%s %q: nonce is %T %v, want a number", e.LoggerName, e.Message, n, n)
			}
		}
		if r, ok := f["rank"]; ok {
			if rs, ok := r.(string); !ok || !strings.Contains(rs, "/") {
				t.Errorf("%s %q: rank is %T %v, want tp/size", e.LoggerName, e.Message, r, r)
			}
			s.ranked[e.Message] = true
		}
	}
	// The path logged about both rooms on both daemons, data plane (the
	// lines with a rank) included.
	for _, name := range []string{"prefilld", "decoded"} {
		s := sides[name]
		if s == nil {
			t.Errorf("%s: no line with a room field", name)
			continue
		}
		if !s.rooms[done] || !s.rooms[aborted] || !s.rooms[replaced] {
			t.Errorf("%s: lines about rooms %v, want %d, %d and %d", name, keys(s.rooms), done, aborted, replaced)
		}
		if len(s.ranked) == 0 {
			t.Errorf("%s: no line about a room with its rank (messages %v)", name, keys(s.msgs))
		}
		t.Logf("%s: %v; with a rank: %v", name, keys(s.msgs), keys(s.ranked))
	}
}

// The lines no test above reaches (refusals, a fence that panicked, a
// frame abandoned at its deadline) keep the shape by construction: in the
// daemons' Go, a field is named room or nonce only inside a key's
// MarshalLogObject (conn.RoomField, transfer.Key), which the sites log with
// zap.Inline. A zap.Stringer("room", key) or zap.Uint64("room", ...) written
// at a site fails here.
func TestRoomAndNonceFieldsAreWrittenOnlyByTheKeysMarshalers(t *testing.T) {
	checked := 0
	for _, dir := range []string{"../../cmd", "../../internal", "../../pkg"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			checked++
			for _, decl := range f.Decls {
				if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == "MarshalLogObject" {
					continue
				}
				ast.Inspect(decl, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok || len(call.Args) == 0 {
						return true
					}
					lit, ok := call.Args[0].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						return true
					}
					if name, _ := strconv.Unquote(lit.Value); name == "room" || name == "nonce" {
						t.Errorf("%s: a %q field written by hand: log the key with conn.RoomField or zap.Inline(transfer.Key)", fset.Position(lit.Pos()), name)
					}
					return true
				})
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 50 {
		t.Fatalf("%d source files checked; want the daemons' whole tree", checked)
	}
}

func keys[K comparable](m map[K]bool) []string {
	var out []string
	for k := range m {
		out = append(out, fmt.Sprint(k))
	}
	sort.Strings(out)
	return out
}
