package service

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestServiceHoldsOnlyTheTransferInterfaces: the daemons hold a
// transfer.Transport and a transfer.Sink built by transfer.NewTransport and
// transfer.NewSink from --data-transport, so a second transport (same-host
// shared memory) plugs in without touching this package. A reference to the
// TCP implementation, or a kind picked here rather than by config, fails.
func TestServiceHoldsOnlyTheTransferInterfaces(t *testing.T) {
	refused := map[string]string{
		"Sender":      "the TCP implementation: hold a transfer.Transport",
		"NewSender":   "the TCP constructor: use transfer.NewTransport",
		"Receiver":    "the TCP implementation: hold a transfer.Sink",
		"NewReceiver": "the TCP constructor: use transfer.NewSink",
		"KindTCP":     "a data transport picked in code: take cfg.DataTransport",
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		alias := ""
		for _, imp := range f.Imports {
			if path, _ := strconv.Unquote(imp.Path.Value); path == "github.com/pdlink/pdlink/pkg/transfer" {
				alias = "transfer"
				if imp.Name != nil {
					alias = imp.Name.Name
				}
			}
		}
		if alias == "" {
			continue
		}
		if alias == "." || alias == "_" {
			t.Errorf("%s imports pkg/transfer as %q: name it, so its uses can be checked", name, alias)
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == alias {
				if why, bad := refused[sel.Sel.Name]; bad {
					t.Errorf("%s: %s.%s is %s", fset.Position(sel.Pos()), alias, sel.Sel.Name, why)
				}
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source file of the package was checked")
	}
}
