package service

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

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
