package deploy

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode"

	"github.com/pdlink/pdlink/pkg/metrics"
	"github.com/pdlink/pdlink/pkg/poll"
)

// selector is one vector selector found in a PromQL expression: a metric
// name and its label matchers.
type selector struct {
	name     string
	matchers []matcher
}

type matcher struct{ label, op, value string }

// promqlFuncs are PromQL's functions and aggregation operators (Prometheus
// 2.x and 3.x); an identifier followed by "(" must be one of them.
var promqlFuncs = setOf(`abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes
	clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month deg
	delta deriv double_exponential_smoothing end exp floor histogram_avg histogram_count histogram_fraction
	histogram_quantile histogram_stddev histogram_stdvar histogram_sum holt_winters hour idelta increase irate
	label_join label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month
	pi predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort
	sort_by_label sort_by_label_desc sort_desc sqrt start stddev_over_time stdvar_over_time sum_over_time tan
	tanh time timestamp vector year
	sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio`)

var promqlAggregations = setOf(`sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio`)

// promqlModifiers take a parenthesised label list.
var promqlModifiers = setOf(`by without on ignoring group_left group_right`)

var promqlKeywords = setOf(`and or unless bool offset atan2 inf nan`)

func setOf(s string) map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Fields(s) {
		m[f] = true
	}
	return m
}

// parseSelectors lexes a PromQL expression (Grafana variables allowed) and
// returns its vector selectors. It is not a parser: it knows where metric
// names can stand (identifiers that are not functions, keywords or label
// lists) and rejects unknown functions. Syntax is checked by promtool and,
// in TestAlertFiresAndResolvesInPrometheus, by a real Prometheus.
func parseSelectors(expr string) ([]selector, error) {
	var out []selector
	r := []rune(expr)
	i := 0
	skipSpace := func() {
		for i < len(r) && unicode.IsSpace(r[i]) {
			i++
		}
	}
	// skipGroup skips from an opening bracket to its match, minding strings.
	skipGroup := func(open, close rune) (string, error) {
		start, depth := i, 0
		for ; i < len(r); i++ {
			switch c := r[i]; {
			case c == '"' || c == '\'' || c == '`':
				q := c
				for i++; i < len(r) && r[i] != q; i++ {
					if r[i] == '\\' && q != '`' {
						i++
					}
				}
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					i++
					return string(r[start+1 : i-1]), nil
				}
			}
		}
		return "", fmt.Errorf("unbalanced %c in %q", open, expr)
	}
	isIdent := func(c rune, first bool) bool {
		return c == '_' || c == ':' || unicode.IsLetter(c) || (!first && unicode.IsDigit(c))
	}
	for {
		skipSpace()
		if i >= len(r) {
			return out, nil
		}
		c := r[i]
		switch {
		case c == '#':
			for i < len(r) && r[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			if _, err := skipGroupString(r, &i); err != nil {
				return nil, fmt.Errorf("%v in %q", err, expr)
			}
		case c == '[':
			if _, err := skipGroup('[', ']'); err != nil {
				return nil, err
			}
		case c == '{':
			body, err := skipGroup('{', '}')
			if err != nil {
				return nil, err
			}
			ms, err := parseMatchers(body)
			if err != nil {
				return nil, fmt.Errorf("%v in %q", err, expr)
			}
			sel := selector{matchers: ms}
			for _, m := range ms {
				if m.label == "__name__" && m.op == "=" {
					sel.name = m.value
				}
			}
			if sel.name == "" {
				return nil, fmt.Errorf("selector {%s} without a metric name in %q", body, expr)
			}
			out = append(out, sel)
		case c == '$': // Grafana variable: $name or ${name}
			i++
			if i < len(r) && r[i] == '{' {
				if _, err := skipGroup('{', '}'); err != nil {
					return nil, err
				}
			}
			for i < len(r) && isIdent(r[i], false) {
				i++
			}
		case unicode.IsDigit(c) || (c == '.' && i+1 < len(r) && unicode.IsDigit(r[i+1])):
			for i < len(r) && (isIdent(r[i], false) || r[i] == '.') {
				i++
			}
		case isIdent(c, true):
			start := i
			for i < len(r) && isIdent(r[i], false) {
				i++
			}
			id := string(r[start:i])
			skipSpace()
			next := rune(0)
			if i < len(r) {
				next = r[i]
			}
			switch {
			case promqlModifiers[id]:
				if next == '(' {
					if _, err := skipGroup('(', ')'); err != nil {
						return nil, err
					}
				}
			case promqlKeywords[id]:
			case next == '(':
				if !promqlFuncs[id] {
					return nil, fmt.Errorf("unknown function %s in %q", id, expr)
				}
			case promqlAggregations[id] && (strings.HasPrefix(string(r[i:]), "by") || strings.HasPrefix(string(r[i:]), "without")):
			default:
				sel := selector{name: id}
				if next == '{' {
					body, err := skipGroup('{', '}')
					if err != nil {
						return nil, err
					}
					if sel.matchers, err = parseMatchers(body); err != nil {
						return nil, fmt.Errorf("%v in %q", err, expr)
					}
				}
				out = append(out, sel)
			}
		default:
			i++
		}
	}
}

func skipGroupString(r []rune, i *int) (string, error) {
	q := r[*i]
	start := *i
	for *i++; *i < len(r) && r[*i] != q; *i++ {
		if r[*i] == '\\' && q != '`' {
			*i++
		}
	}
	if *i >= len(r) {
		return "", fmt.Errorf("unterminated string")
	}
	*i++
	return string(r[start+1 : *i-1]), nil
}

var matcherRE = regexp.MustCompile(`^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`" + `)\s*$`)

func parseMatchers(body string) ([]matcher, error) {
	var out []matcher
	for _, part := range splitTopLevel(body) {
		if strings.TrimSpace(part) == "" {
			continue
		}
		m := matcherRE.FindStringSubmatch(part)
		if m == nil {
			return nil, fmt.Errorf("bad label matcher %q", part)
		}
		v := m[3][1 : len(m[3])-1]
		if m[3][0] != '`' {
			v = strings.NewReplacer(`\\`, `\`, `\"`, `"`, `\'`, `'`).Replace(v)
		}
		out = append(out, matcher{m[1], m[2], v})
	}
	return out, nil
}

// splitTopLevel splits matchers on commas outside quotes.
func splitTopLevel(s string) []string {
	var out []string
	var q rune
	start := 0
	for i, c := range s {
		switch {
		case q != 0 && c == q && (i == 0 || s[i-1] != '\\'):
			q = 0
		case q != 0:
		case c == '"' || c == '\'' || c == '`':
			q = c
		case c == ',':
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// exportedNames is every series name a pdlink daemon's /metrics has:
// metrics.Names() (histograms as _bucket, _sum and _count), plus the Go and
// process collectors; "up" is Prometheus' own.
func exportedNames() map[string]bool {
	out := map[string]bool{"up": true}
	for n, typ := range metrics.Names() {
		if typ == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[n+s] = true
			}
			continue
		}
		out[n] = true
	}
	return out
}

// labelValues are the closed sets of label values the daemons export, by
// metric and label ("*" for every pdlink metric).
func labelValues() map[string]map[string][]string {
	var states []string
	for _, s := range poll.AllStates() {
		states = append(states, s.String())
	}
	var reasons []string
	for _, r := range poll.AllReasons() {
		reasons = append(reasons, string(r))
	}
	stateful := map[string][]string{"state": states}
	return map[string]map[string][]string{
		"*":                                   {"side": {metrics.SidePrefill, metrics.SideDecode}},
		"pdlink_rooms":                        stateful,
		"pdlink_room_oldest_age_seconds":      stateful,
		"pdlink_rooms_overdue":                stateful,
		"pdlink_room_deadline_seconds":        stateful,
		"pdlink_room_transitions_total":       {"from": append([]string{""}, states...), "to": states},
		"pdlink_room_failures_total":          {"reason": reasons},
		"pdlink_rooms_reaped_total":           {"reason": {string(poll.ReasonUncleared)}},
		"pdlink_room_duration_seconds_bucket": {"outcome": {"success", "failed"}},
		"pdlink_room_duration_seconds_count":  {"outcome": {"success", "failed"}},
		"pdlink_room_duration_seconds_sum":    {"outcome": {"success", "failed"}},
	}
}

// checkSelectors reports selectors naming a metric the daemons do not export
// or a label value they never produce (a misspelt state or reason makes an
// alert silently never fire).
func checkSelectors(expr string) []string {
	sels, err := parseSelectors(expr)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	names, values := exportedNames(), labelValues()
	for _, s := range sels {
		if !names[s.name] && !strings.HasPrefix(s.name, "go_") && !strings.HasPrefix(s.name, "process_") {
			problems = append(problems, fmt.Sprintf("%s: not a metric the daemons export", s.name))
			continue
		}
		for _, m := range s.matchers {
			known, ok := values[s.name][m.label]
			if !ok && metrics.IsPdlinkName(s.name) {
				known, ok = values["*"][m.label]
			}
			if !ok || strings.Contains(m.value, "$") {
				continue
			}
			if p := checkMatcher(m, known); p != "" {
				problems = append(problems, fmt.Sprintf("%s{%s%s%q}: %s", s.name, m.label, m.op, m.value, p))
			}
		}
	}
	sort.Strings(problems)
	return problems
}

func checkMatcher(m matcher, known []string) string {
	switch m.op {
	case "=", "!=":
		for _, k := range known {
			if k == m.value {
				return ""
			}
		}
		return fmt.Sprintf("value not in %q", known)
	}
	re, err := regexp.Compile("^(?:" + m.value + ")$")
	if err != nil {
		return err.Error()
	}
	// Every alternative must match something the daemons export.
	for _, alt := range strings.Split(m.value, "|") {
		altRE, err := regexp.Compile("^(?:" + alt + ")$")
		if err != nil {
			altRE = re
		}
		hit := false
		for _, k := range known {
			if altRE.MatchString(k) {
				hit = true
			}
		}
		if !hit {
			return fmt.Sprintf("alternative %q matches none of %q", alt, known)
		}
	}
	return ""
}
