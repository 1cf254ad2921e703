package transfer

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
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

// TestReasonWireCodesAreFixed pins each reason's RESULT status code: the code is what the
// peer daemon reads, so renumbering one (or giving a new reason a code another build reads
// as something else) changes what a room fails with on the other side.
func TestReasonWireCodesAreFixed(t *testing.T) {
	golden := map[Reason]reasonCode{
		ReasonChecksum:       1,
		ReasonTransferError:  2,
		ReasonInvalid:        3,
		ReasonFenced:         4,
		ReasonRegionReplaced: 5,
	}
	if len(golden) != len(AllReasons()) {
		t.Fatalf("golden table has %d reasons, AllReasons %d: pin the new reason's code here", len(golden), len(AllReasons()))
	}
	for r, want := range golden {
		if got := r.code(); got != want {
			t.Errorf("reason %q has wire code %d, want %d", r, got, want)
		}
	}
}

// TestStatFailureReasonsOfAPrefillFile: what each way a proven prefill file can change
// fails a same-host room with (goneReason over Mapping.Check's real errors): replaced at
// its path or removed is the file's region_replaced, the reason prefill gives for the same
// event; truncated under the layout (the same inode) is transfer_error, as a fault
// mid-copy is.
func TestStatFailureReasonsOfAPrefillFile(t *testing.T) {
	l := UniformLayout(1, 4, 4096, 0, 0)
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, path string)
		want   Reason
	}{
		{"replaced", func(t *testing.T, path string) {
			tmp := path + ".next"
			if err := os.WriteFile(tmp, make([]byte, l.Size()), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
		}, ReasonRegionReplaced},
		{"removed", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, ReasonRegionReplaced},
		{"truncated", func(t *testing.T, path string) {
			if err := os.Truncate(path, l.Size()/2); err != nil {
				t.Fatal(err)
			}
		}, ReasonTransferError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, err := CreateRegionFile(t.TempDir(), l)
			if err != nil {
				t.Fatal(err)
			}
			m, err := OpenMapping(path, l)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			tc.change(t, path)
			err = m.Check()
			if err == nil {
				t.Fatal("Check passed on a changed file")
			}
			if !isRegionGone(err) {
				t.Fatalf("Check: %v, not a gone file", err)
			}
			if got := goneReason(err); got != tc.want {
				t.Fatalf("%s file (%v): reason %q, want %q", tc.name, err, got, tc.want)
			}
		})
	}
}
