package service

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// A tp_size beyond what a room can expect is refused at the edge, before
// it could wrap around in the data plane's 16-bit rank.
func TestRankBeyondMaxRanksIsRefusedAtTheEdge(t *testing.T) {
	wantField(t, validateRank("rank", &pb.Rank{TpRank: 0, TpSize: 1<<16 + 1}), "rank")
	wantField(t, validateRank("rank", &pb.Rank{TpRank: 0, TpSize: poll.MaxRanks + 1}), "rank")
	if err := validateRank("rank", &pb.Rank{TpRank: poll.MaxRanks - 1, TpSize: poll.MaxRanks}); err != nil {
		t.Fatalf("rank %d of %d refused: %v", poll.MaxRanks-1, poll.MaxRanks, err)
	}
}

// An empty Rank{} (tp_size 0) is not "rank 0 of 1": an absent rank is.
// Every RPC that takes a rank refuses it at the edge with InvalidArgument
// naming the field, the same answer whichever call carries it, instead of
// passing it on as rank 0 of 1 (opens, Send) or to the owner, which
// refused it as an invalid frame (region calls, SendMetadata).
func TestEmptyRankIsInvalidArgumentNamingTheFieldOnEveryRPC(t *testing.T) {
	p := startPair(t)
	pre, dec := registerRegions(t, p)
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: 8, PrefillBootstrapAddr: p.bootstrap}); err != nil {
		t.Fatal(err)
	}
	empty := func() *pb.Rank { return &pb.Rank{} }
	withEmptyRank := func(r region) *pb.RegionLayout {
		l := layoutPB(r.layout)
		l.Rank = empty()
		return l
	}
	answers := map[string][]string{} // description -> calls that gave it
	for _, c := range []rpcCase{
		{"prefill RegisterRegion", func(ctx context.Context) error {
			_, err := p.prefill.RegisterRegion(ctx, &pb.PrefillServiceRegisterRegionRequest{RegionPath: pre.path, Layout: withEmptyRank(pre)})
			return err
		}, codes.InvalidArgument, "layout.rank"},
		{"decode RegisterRegion", func(ctx context.Context) error {
			_, err := p.decode.RegisterRegion(ctx, &pb.DecodeServiceRegisterRegionRequest{RegionPath: dec.path, Layout: withEmptyRank(dec)})
			return err
		}, codes.InvalidArgument, "layout.rank"},
		{"prefill UnregisterRegion", func(ctx context.Context) error {
			_, err := p.prefill.UnregisterRegion(ctx, &pb.PrefillServiceUnregisterRegionRequest{Rank: empty()})
			return err
		}, codes.InvalidArgument, "rank"},
		{"decode UnregisterRegion", func(ctx context.Context) error {
			_, err := p.decode.UnregisterRegion(ctx, &pb.DecodeServiceUnregisterRegionRequest{Rank: empty()})
			return err
		}, codes.InvalidArgument, "rank"},
		{"OpenSender", func(ctx context.Context) error {
			_, err := p.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: 9, Rank: empty()})
			return err
		}, codes.InvalidArgument, "rank"},
		{"Send", func(ctx context.Context) error {
			_, err := p.prefill.Send(ctx, &pb.SendRequest{RoomId: 7, Rank: empty(), Pages: &pb.PageList{Indices: []int32{0}}})
			return err
		}, codes.InvalidArgument, "rank"},
		{"OpenReceiver", func(ctx context.Context) error {
			_, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: 10, PrefillBootstrapAddr: p.bootstrap, Rank: empty()})
			return err
		}, codes.InvalidArgument, "rank"},
		{"SendMetadata", func(ctx context.Context) error {
			_, err := p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: 8, Rank: empty(), DstPages: &pb.PageList{Indices: []int32{0}}})
			return err
		}, codes.InvalidArgument, "rank"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.call(ctxT(t))
			for _, d := range status.Convert(err).Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					desc := br.GetFieldViolations()[0].GetDescription()
					answers[desc] = append(answers[desc], c.name)
				}
			}
			wantField(t, err, c.field)
		})
	}
	if len(answers) != 1 {
		t.Errorf("an empty rank gets %d different answers, want one: %q", len(answers), answers)
	}
	// Nothing was taken as rank 0 of 1: no room opened, both regions stay.
	for _, id := range []uint64{9, 10} {
		if pr, dr := pollState(t, p, id); pr.GetFound() || dr.GetFound() {
			t.Errorf("room %d opened with an empty rank: prefill %v, decode %v", id, pr, dr)
		}
	}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: 8, DstPages: &pb.PageList{Indices: []int32{0}}}); err != nil {
		t.Fatalf("decode's region or room 8 was touched by a refused call: %v", err)
	}
}

// The exported API of the packages that carry ranks says rank: none of the
// old names (part, the number of parts, TPRank, ExpectedSenders, sender
// count) is left in an exported identifier, in the parameters of exported
// functions, or in their doc.
func TestExportedAPISpeaksOfRanksOnly(t *testing.T) {
	for id, old := range map[string]bool{"TPRank": true, "OnPartDone": true, "MaxParts": true, "parts": true,
		"ExpectedSenders": true, "SenderCount": true, "Partition": false, "ExpectedRanks": false, "HTTPServer": false, "Rank": false} {
		if oldWords(id) != old {
			t.Fatalf("oldWords(%q) = %v (words %q)", id, !old, words(id))
		}
	}
	for _, pkg := range []string{"poll", "conn", "transfer"} {
		dir := filepath.Join("..", "..", "pkg", pkg)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			for _, bad := range oldRankNames(f) {
				t.Errorf("%s: %s", fset.Position(bad.pos), bad.what)
			}
		}
	}
}

type oldName struct {
	pos  token.Pos
	what string
}

// words splits an identifier into its lower-case words: OnPartDone is
// on, part, done; TPRank is tp, rank; Partition is one word.
func words(id string) []string {
	var out []string
	start := 0
	upper := func(c byte) bool { return c >= 'A' && c <= 'Z' }
	for i := 1; i < len(id); i++ {
		c, prev := id[i], id[i-1]
		acronymEnd := upper(prev) && upper(c) && i+1 < len(id) && !upper(id[i+1]) && id[i+1] != '_'
		if c == '_' || upper(c) && !upper(prev) || acronymEnd {
			if w := strings.Trim(id[start:i], "_"); w != "" {
				out = append(out, strings.ToLower(w))
			}
			start = i
		}
	}
	if w := strings.Trim(id[start:], "_"); w != "" {
		out = append(out, strings.ToLower(w))
	}
	return out
}

// oldWords reports whether an identifier uses an old name for rank. Words
// are compared whole (Partition is not Part).
func oldWords(id string) bool {
	ws := words(id)
	for i, w := range ws {
		if w == "part" || w == "parts" {
			return true
		}
		if i+1 < len(ws) {
			switch w + " " + ws[i+1] {
			case "tp rank", "expected senders", "sender count", "senders count":
				return true
			}
		}
	}
	return false
}

var oldPhrase = regexp.MustCompile(`(?i)\bsender counts?\b|\bexpected senders\b|\bTPRank\b|\bExpectedSenders\b`)

func oldRankNames(f *ast.File) []oldName {
	var out []oldName
	ident := func(id *ast.Ident, what string) {
		if id != nil && oldWords(id.Name) {
			out = append(out, oldName{id.Pos(), what + " " + id.Name})
		}
	}
	doc := func(g *ast.CommentGroup) {
		if g == nil {
			return
		}
		if m := oldPhrase.FindString(g.Text()); m != "" {
			out = append(out, oldName{g.Pos(), "doc says " + m})
		}
	}
	fields := func(fl *ast.FieldList, what string, exportedOnly bool) {
		if fl == nil {
			return
		}
		for _, fd := range fl.List {
			doc(fd.Doc)
			for _, n := range fd.Names {
				if !exportedOnly || n.IsExported() {
					ident(n, what)
				}
			}
		}
	}
	funcType := func(ft *ast.FuncType) {
		fields(ft.Params, "parameter", false)
		fields(ft.Results, "result", false)
	}
	doc(f.Doc)
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv != nil && len(d.Recv.List) == 1 && !exportedRecv(d.Recv.List[0].Type) {
				continue
			}
			doc(d.Doc)
			ident(d.Name, "func")
			funcType(d.Type)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					doc(d.Doc)
					doc(s.Doc)
					ident(s.Name, "type")
					switch tt := s.Type.(type) {
					case *ast.StructType:
						fields(tt.Fields, "field", true)
					case *ast.InterfaceType:
						for _, m := range tt.Methods.List {
							doc(m.Doc)
							for _, n := range m.Names {
								ident(n, "method")
							}
							if ft, ok := m.Type.(*ast.FuncType); ok {
								funcType(ft)
							}
						}
					case *ast.FuncType:
						funcType(tt)
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							doc(d.Doc)
							doc(s.Doc)
							ident(n, "value")
						}
					}
				}
			}
		}
	}
	return out
}

func exportedRecv(e ast.Expr) bool {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.Ident:
			return t.IsExported()
		default:
			return false
		}
	}
}
