package transfer

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestAllReasonsListsEveryReasonConstant keeps AllReasons the closed set: a Reason constant
// declared anywhere in the package but missing from AllReasons fails here, so the tests that
// iterate AllReasons (wire codes here, room reasons in the daemon) also cover it.
func TestAllReasonsListsEveryReasonConstant(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var declared []Reason
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Reason" {
					continue
				}
				for i := range vs.Names {
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("Reason constant %s is not a string literal", vs.Names[i].Name)
					}
					declared = append(declared, Reason(lit.Value[1:len(lit.Value)-1]))
				}
			}
		}
	}
	if len(declared) == 0 {
		t.Fatal("found no Reason constants: the parse is looking in the wrong place")
	}
	for _, r := range declared {
		if !slices.Contains(AllReasons(), r) {
			t.Errorf("Reason %q is declared but missing from AllReasons", r)
		}
	}
	if len(declared) != len(AllReasons()) {
		t.Errorf("AllReasons has %d reasons, the package declares %d", len(AllReasons()), len(declared))
	}
}

// TestEveryReasonRoundTripsItsWireCode: a RESULT frame carries a reason as a code, so each
// reason needs a code of its own that decodes back to it (a reason without one would reach
// the sender as "invalid").
func TestEveryReasonRoundTripsItsWireCode(t *testing.T) {
	seen := map[reasonCode]Reason{}
	for _, r := range AllReasons() {
		c := r.code()
		if c == codeOK || c > maxReasonCode {
			t.Errorf("reason %q has wire code %d, outside 1..%d", r, c, maxReasonCode)
		}
		if other, dup := seen[c]; dup {
			t.Errorf("reasons %q and %q share wire code %d", other, r, c)
		}
		seen[c] = r
		if got := reasonFromCode(uint32(c)); got != r {
			t.Errorf("reason %q encodes as %d, which decodes as %q", r, c, got)
		}
	}
}
