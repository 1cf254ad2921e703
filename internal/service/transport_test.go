package service

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdlink/pdlink/pkg/transfer"
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

// TestDataPlaneReadyLogNamesTheTransport: an operator can tell which data
// transport a daemon runs from its "data plane ready" line, logged on
// both sides once the region is registered and the data plane built.
func TestDataPlaneReadyLogNamesTheTransport(t *testing.T) {
	for _, side := range []string{"prefill", "decode"} {
		t.Run(side, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			log := zap.New(core)
			r := newRegion(t)
			var slot *regionSlot
			var closeData func()
			switch side {
			case "prefill":
				d := NewPrefillData(transfer.KindTCP, transfer.SenderConfig{}, log)
				slot, closeData = &d.slot, d.Close
			case "decode":
				d := NewDecodeData(transfer.KindTCP, transfer.ReceiverConfig{}, log)
				slot, closeData = &d.slot, d.Close
			}
			defer closeData()
			if _, err := slot.register(r.path, layoutPB(r.layout)); err != nil {
				t.Fatal(err)
			}
			ready := logs.FilterMessage("data plane ready").All()
			if len(ready) != 1 {
				t.Fatalf("%d \"data plane ready\" lines, want 1: %v", len(ready), logs.All())
			}
			fields := ready[0].ContextMap()
			if fields["transport"] != string(transfer.KindTCP) || fields["region"] != r.path {
				t.Fatalf("data plane ready fields %v, want transport %q and region %q", fields, transfer.KindTCP, r.path)
			}
		})
	}
}

// TestAnUnknownKindRefusesTheRegionNotTheProcess: a kind that reached the
// data plane without passing config validation fails RegisterRegion with
// the constructor's error rather than leaving a daemon without a data plane.
func TestAnUnknownKindRefusesTheRegionNotTheProcess(t *testing.T) {
	d := NewDecodeData(transfer.Kind("carrier-pigeon"), transfer.ReceiverConfig{}, zap.NewNop())
	defer d.Close()
	r := newRegion(t)
	_, err := d.slot.register(r.path, layoutPB(r.layout))
	if err == nil || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Fatalf("register with an unknown kind: %v, want an error naming it", err)
	}
	if d.slot.get() != nil {
		t.Fatal("the region stayed registered without a data plane")
	}
}
