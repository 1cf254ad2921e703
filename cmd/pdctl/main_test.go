package main

import (
	"bytes"
	"strings"
	"testing"
)

// `pdctl -help` and `pdctl rooms -help` print the help like -h, instead of
// "unknown shorthand flag: 'e' in -elp".
func TestSingleDashHelpPrintsTheHelpOfEachCommand(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-help"}, "pdlink operator and load tool"},
		{[]string{"rooms", "-help"}, "--min-age"},
		{[]string{"watch", "-help"}, "--for"},
		{[]string{"rooms", "-h"}, "--min-age"},
	} {
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(c.args)
		if err := root.Execute(); err != nil {
			t.Errorf("pdctl %v: %v", c.args, err)
			continue
		}
		if !strings.Contains(out.String(), "Usage:") || !strings.Contains(out.String(), c.want) {
			t.Errorf("pdctl %v printed %q, want its help", c.args, out.String())
		}
	}
}
