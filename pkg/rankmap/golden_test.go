package rankmap

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// mhaSide is a GQA model with 2 KV buffers (one layer's K and V) of totalHeads heads of
// 128 bf16 values, 4-token pages, split over tp ranks.
func mhaSide(tp, totalHeads int) Topology {
	b := Buffer{PageTokens: 4, TotalHeads: totalHeads, RankHeads: max(totalHeads/tp, 1), HeadBytes: 256}
	return Topology{TP: tp, Attention: MHA, Buffers: []Buffer{b, b}, AuxRowBytes: 64}
}

// mlaSide is a DeepSeek-style latent (576 bf16 values per token) in 2 layer buffers.
func mlaSide(tp int) Topology {
	b := Buffer{PageTokens: 4, TotalHeads: 1, RankHeads: 1, HeadBytes: 1152}
	return Topology{TP: tp, Attention: MLA, Buffers: []Buffer{b, b}, AuxRowBytes: 64}
}

// goldenCases are the mappings SGLang runs, by name.
var goldenCases = []struct {
	name            string
	prefill, decode Topology
}{
	{"mha_1_to_1", mhaSide(1, 8), mhaSide(1, 8)},
	{"mha_2_to_2", mhaSide(2, 8), mhaSide(2, 8)},
	{"mha_2_to_4", mhaSide(2, 8), mhaSide(4, 8)},
	{"mha_4_to_2", mhaSide(4, 8), mhaSide(2, 8)},
	{"mha_1_to_8", mhaSide(1, 8), mhaSide(8, 8)},
	{"mha_8_to_1", mhaSide(8, 8), mhaSide(1, 8)},
	{"mla_2_to_4", mlaSide(2), mlaSide(4)},
	{"mla_4_to_2", mlaSide(4), mlaSide(2)},
	{"gqa2_8_to_8_replicated", mhaSide(8, 2), mhaSide(8, 2)},
	{"gqa2_2_to_8_replicated_decode", mhaSide(2, 2), mhaSide(8, 2)},
	{"gqa2_8_to_2_replicated_prefill", mhaSide(8, 2), mhaSide(2, 2)},
	{"gqa2_8_to_4_replicated_both", mhaSide(8, 2), mhaSide(4, 2)},
	{"gqa4_8_to_2_merge_replicas", mhaSide(8, 4), mhaSide(2, 4)},
}

// TestGoldenPlans shows the plan for every mapping SGLang runs; testdata/plans.golden is
// the reviewed form (rewrite with -update).
func TestGoldenPlans(t *testing.T) {
	var out strings.Builder
	for _, tc := range goldenCases {
		m, err := Plan(tc.prefill, tc.decode)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		checkStructure(t, m)
		out.WriteString("## " + tc.name + "\n" + m.String() + "\n")
	}
	const golden = "testdata/plans.golden"
	got := out.String()
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("plans differ from %s (run with -update if intended):\n%s", golden, got)
	}
}
