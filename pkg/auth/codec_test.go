package auth_test

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/auth"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/transfer"
)

var (
	_ conn.Authenticator     = (*auth.Control)(nil)
	_ transfer.Authenticator = (*auth.Data)(nil)
)

var (
	token      = []byte("0123456789abcdef0123456789abcdef")
	otherToken = []byte("fedcba9876543210fedcba9876543210")
)

func keyring(t testing.TB, tokens ...[]byte) *auth.Keyring {
	t.Helper()
	k, err := auth.New(auth.Config{}, tokens...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func register(seq uint64) *pdlinkv1.Envelope {
	return &pdlinkv1.Envelope{ProtocolVersion: conn.ProtocolVersion, SenderInstance: "d1", Epoch: 100, Seq: seq,
		Body: &pdlinkv1.Envelope_Register{Register: &pdlinkv1.Register{InstanceId: "d1", DataEndpoint: "10.0.0.2:7000"}}}
}

func abort(seq, room, nonce uint64) *pdlinkv1.Envelope {
	return &pdlinkv1.Envelope{ProtocolVersion: conn.ProtocolVersion, SenderInstance: "d1", Epoch: 100, Seq: seq,
		Body: &pdlinkv1.Envelope_Abort{Abort: &pdlinkv1.Abort{RoomId: room, Nonce: nonce, Reason: "timeout:bootstrapping"}}}
}

func metadata(seq uint64) *pdlinkv1.Envelope {
	return &pdlinkv1.Envelope{ProtocolVersion: conn.ProtocolVersion, SenderInstance: "d1", Epoch: 100, Seq: seq,
		Body: &pdlinkv1.Envelope_Metadata{Metadata: &pdlinkv1.Metadata{RoomId: 7, Nonce: 99, Rank: &pdlinkv1.Rank{TpSize: 1},
			DstPages: &pdlinkv1.PageList{Indices: []int32{3, 1, 2}}, ExpectedSenders: 1}}}
}

// wantAuthReject checks that Decode refused frame as conn.RejectAuth with
// the auth reason want, and counted it.
func wantAuthReject(t *testing.T, c *conn.Codec, k *auth.Keyring, frame []byte, want auth.Reason) {
	t.Helper()
	before := k.Stats().Rejected(want)
	env, err := c.Decode(frame)
	if env != nil || err == nil {
		t.Fatal("forged frame decoded")
	}
	if r, ok := conn.RejectReasonOf(err); !ok || r != conn.RejectAuth {
		t.Fatalf("conn reason %v (%v): %v", r, ok, err)
	}
	// conn.Codec wraps the Authenticator's error with %v, so auth.ReasonOf
	// does not see through it; the keyring's counter is the record.
	if got := k.Stats().Rejected(want); got != before+1 {
		t.Fatalf("%v counted %d -> %d", want, before, got)
	}
}

func TestCodecPassesSealedFramesBothWays(t *testing.T) {
	p, d := keyring(t, token), keyring(t, token)
	toPrefill := &conn.Codec{Auth: d.Control(auth.SideDecode)}
	atPrefill := &conn.Codec{Auth: p.Control(auth.SidePrefill)}
	for name, env := range map[string]*pdlinkv1.Envelope{"register": register(1), "metadata": metadata(2), "abort": abort(3, 7, 99)} {
		b, err := toPrefill.Encode(env)
		if err != nil {
			t.Fatal(err)
		}
		got, err := atPrefill.Decode(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got.Mac) != auth.MACLen {
			t.Fatalf("%s: mac %x", name, got.Mac)
		}
		got.Mac = nil
		if !proto.Equal(got, env) {
			t.Fatalf("%s changed", name)
		}
		t.Logf("%-8s %3d bytes sealed", name, len(b))
	}
	b, _ := atPrefill.Encode(abort(1, 7, 99))
	if _, err := toPrefill.Decode(b); err != nil {
		t.Fatalf("prefill -> decode: %v", err)
	}
}

// TestForgedRegisterAndAbortAreRejectedByTheCodec: no MAC, a MAC under
// another token, a MAC reused on an altered body, a frame reflected to its
// sender: each refused as auth before any state could see it.
func TestForgedRegisterAndAbortAreRejectedByTheCodec(t *testing.T) {
	prefill := keyring(t, token)
	atPrefill := &conn.Codec{Auth: prefill.Control(auth.SidePrefill)}
	fromDecode := &conn.Codec{Auth: keyring(t, token).Control(auth.SideDecode)}
	forger := &conn.Codec{Auth: keyring(t, otherToken).Control(auth.SideDecode)}
	unauth := &conn.Codec{}
	for name, env := range map[string]*pdlinkv1.Envelope{"register": register(1), "abort": abort(2, 7, 99)} {
		t.Run(name, func(t *testing.T) {
			b, _ := unauth.Encode(env)
			wantAuthReject(t, atPrefill, prefill, b, auth.ReasonMACMissing)
			b, _ = forger.Encode(env)
			wantAuthReject(t, atPrefill, prefill, b, auth.ReasonMACInvalid)
			// Reflected: sealed by the prefill side itself.
			b, _ = atPrefill.Encode(env)
			wantAuthReject(t, atPrefill, prefill, b, auth.ReasonMACInvalid)
			// Garbage MAC of the right length.
			b, _ = unauth.Encode(env)
			b = protowire.AppendTag(b, 5, protowire.BytesType)
			b = protowire.AppendBytes(b, make([]byte, auth.MACLen))
			wantAuthReject(t, atPrefill, prefill, b, auth.ReasonMACInvalid)
		})
	}
	// A genuine ABORT's MAC moved onto an ABORT for the victim's room.
	genuine, _ := fromDecode.Encode(abort(3, 7, 99))
	env, err := atPrefill.Decode(genuine)
	if err != nil {
		t.Fatal(err)
	}
	forged := abort(3, 8, 1234)
	forged.Mac = env.Mac
	b, _ := marshalWithMAC(forged)
	wantAuthReject(t, atPrefill, prefill, b, auth.ReasonMACInvalid)
}

// TestReplayedMetadataWithAnotherSeqOrEpochFails: the MAC covers sender,
// epoch and seq, so a captured METADATA cannot be re-sent under a fresh seq
// (escaping conn's dedupe) or a newer epoch (faking a restart). A
// byte-identical replay passes the codec by design: conn's dedupe and the
// room's nonce catch it (see the package doc).
func TestReplayedMetadataWithAnotherSeqOrEpochFails(t *testing.T) {
	prefill := keyring(t, token)
	atPrefill := &conn.Codec{Auth: prefill.Control(auth.SidePrefill)}
	genuine, _ := (&conn.Codec{Auth: keyring(t, token).Control(auth.SideDecode)}).Encode(metadata(5))
	env, err := atPrefill.Decode(genuine)
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func(*pdlinkv1.Envelope){
		"seq":    func(e *pdlinkv1.Envelope) { e.Seq += 1 << 20 },
		"epoch":  func(e *pdlinkv1.Envelope) { e.Epoch++ },
		"sender": func(e *pdlinkv1.Envelope) { e.SenderInstance = "d2" },
	} {
		e := proto.Clone(env).(*pdlinkv1.Envelope)
		f(e)
		b, _ := marshalWithMAC(e)
		t.Run(name, func(t *testing.T) { wantAuthReject(t, atPrefill, prefill, b, auth.ReasonMACInvalid) })
	}
	if _, err := atPrefill.Decode(genuine); err != nil {
		t.Fatalf("byte-identical replay: %v (the codec is stateless; conn dedupes)", err)
	}
}

// TestFrameMACdWithTheOldTokenAfterTheOverlapIsRejected at the codec.
func TestFrameMACdWithTheOldTokenAfterTheOverlapIsRejected(t *testing.T) {
	prefill := keyring(t, token)
	if _, err := prefill.Rotate(otherToken); err != nil { // zero overlap: the old token retires at once
		t.Fatal(err)
	}
	b, _ := (&conn.Codec{Auth: keyring(t, token).Control(auth.SideDecode)}).Encode(abort(1, 7, 99))
	wantAuthReject(t, &conn.Codec{Auth: prefill.Control(auth.SidePrefill)}, prefill, b, auth.ReasonMACRetired)
}

func marshalWithMAC(e *pdlinkv1.Envelope) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(e)
}
