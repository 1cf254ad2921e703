package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// promtoolIn copies the rule files (with replacements applied to the rules)
// into a temporary directory and runs promtool there.
func promtoolIn(t *testing.T, promtool string, rules []byte, args ...string) ([]byte, error) {
	t.Helper()
	dir := t.TempDir()
	for name, b := range map[string][]byte{
		"pdlink.rules.yml":      rules,
		"pdlink.rules.test.yml": readFile(t, "prometheus/pdlink.rules.test.yml"),
		"prometheus.yml":        readFile(t, "prometheus/prometheus.yml"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return run(t, 60*time.Second, dir, promtool, args...)
}

func TestPromtoolChecksRulesAndConfig(t *testing.T) {
	t.Parallel()
	promtool := tool(t, "promtool", "prometheus")
	rules := readFile(t, rulesPath)
	if out, err := promtoolIn(t, promtool, rules, "check", "rules", "pdlink.rules.yml"); err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := promtoolIn(t, promtool, rules, "check", "config", "prometheus.yml"); err != nil {
		t.Errorf("promtool check config: %v\n%s", err, out)
	}
}

// TestPromtoolRuleUnitTests runs pdlink.rules.test.yml: for every alert a
// case where it fires (labels and rendered runbook) and cases where it must
// not.
func TestPromtoolRuleUnitTests(t *testing.T) {
	t.Parallel()
	promtool := tool(t, "promtool", "prometheus")
	if out, err := promtoolIn(t, promtool, readFile(t, rulesPath), "test", "rules", "pdlink.rules.test.yml"); err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
}

// TestPromtoolCatchesBrokenRules proves the checks above fail when a rule
// breaks: a syntax error, a pin alert that waits too long, a threshold that
// no longer fires, a daemon-down alert that pages on every job.
func TestPromtoolCatchesBrokenRules(t *testing.T) {
	t.Parallel()
	promtool := tool(t, "promtool", "prometheus")
	good := readFile(t, rulesPath)
	for _, tc := range []struct {
		name, from, to string
		args           []string
	}{
		{"syntax error", "pdlink_room_oldest_age_seconds > pdlink_room_deadline_seconds",
			"pdlink_room_oldest_age_seconds > > pdlink_room_deadline_seconds", []string{"check", "rules", "pdlink.rules.yml"}},
		{"pin waits 5m", "        for: 1m\n        labels:\n          severity: page",
			"        for: 5m\n        labels:\n          severity: page", []string{"test", "rules", "pdlink.rules.test.yml"}},
		{"pin compares with twice the deadline", "pdlink_room_oldest_age_seconds > pdlink_room_deadline_seconds",
			"pdlink_room_oldest_age_seconds > 2 * pdlink_room_deadline_seconds", []string{"test", "rules", "pdlink.rules.test.yml"}},
		{"down on any job", `up{job=~"pdlink.*"} == 0`, `up == 0`, []string{"test", "rules", "pdlink.rules.test.yml"}},
		{"failures count aborts", `reason!~"timeout:.*|aborted:.*|shutdown"`, `reason!~"timeout:.*|shutdown"`,
			[]string{"test", "rules", "pdlink.rules.test.yml"}},
	} {
		bad := bytes.Replace(good, []byte(tc.from), []byte(tc.to), 1)
		if bytes.Equal(bad, good) {
			t.Fatalf("%s: %q not in %s", tc.name, tc.from, rulesPath)
		}
		if out, err := promtoolIn(t, promtool, bad, tc.args...); err == nil {
			t.Errorf("%s: promtool %v passed\n%s", tc.name, tc.args, out)
		}
	}
}
