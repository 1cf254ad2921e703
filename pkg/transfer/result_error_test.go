package transfer

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// A RESULT's failure reads as what decode did, with its wire code: fenced (decode ended
// the room or does not expect the stream), rejected as invalid, or the reported checksum,
// transfer_error or region_replaced; each keeps its reason and its sentinel.
func TestResultErrorSaysWhatTheReceiverDidWithItsCode(t *testing.T) {
	for _, c := range []struct {
		reason Reason
		says   string
		is     error
	}{
		{ReasonFenced, "receiver fenced the room (result code 4)", ErrRejected},
		{ReasonInvalid, "receiver rejected the room's frames as invalid (result code 3)", ErrRejected},
		{ReasonChecksum, "payload checksum mismatch (reported by receiver, result code 1)", ErrChecksum},
		{ReasonTransferError, "data connection broken (reported by receiver, result code 2)", ErrConnBroken},
		{ReasonRegionReplaced, "region file replaced (reported by receiver, result code 5)", ErrRegionReplaced},
	} {
		err := resultError(uint32(c.reason.code()))
		var re *ResultError
		if !strings.Contains(err.Error(), c.says) || !errors.Is(err, c.is) || ReasonOf(err) != c.reason ||
			!errors.As(err, &re) || re.Code != uint32(c.reason.code()) {
			t.Errorf("%s: %q (reason %s); want it to say %q, match %v", c.reason, err, ReasonOf(err), c.says, c.is)
		}
	}
	if err := resultError(uint32(codeOK)); err != nil {
		t.Fatalf("ok result: %v", err)
	}
}

// prefilld's "room transfer failed" line names the reason and, when decode's RESULT said
// so, its wire code: here a DONE decode does not expect, answered fenced.
func TestRoomTransferFailedLogNamesTheResultCode(t *testing.T) {
	l := UniformLayout(1, 8, 256, 1, 16)
	_, _, _, addr := rawReceiver(t, l, ReceiverConfig{})
	core, logs := observer.New(zapcore.InfoLevel)
	err := sendOnce(t, l, addr, SenderConfig{Logger: zap.New(core)}, Key{Room: 5, Nonce: 9}, [][]Run{{{2, 1}}}, make([]byte, 16))
	if ReasonOf(err) != ReasonFenced {
		t.Fatalf("outcome %v, want fenced", err)
	}
	lines := logs.FilterMessage("room transfer failed").All()
	if len(lines) != 1 {
		t.Fatalf("%d \"room transfer failed\" lines, want 1", len(lines))
	}
	f := lines[0].ContextMap()
	if f["reason"] != "fenced" || f["result_code"] != uint32(codeFenced) || !strings.Contains(f["error"].(string), "fenced the room") {
		t.Fatalf("line %v, want reason fenced, result_code %d and an error saying fenced", f, codeFenced)
	}
	wantKeyFields(t, f)
}
