package conn

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// FuzzDecodeEnvelope feeds arbitrary bytes to the frame decoder and
// validator: it must never panic, and whatever it accepts must encode and
// decode again to the same envelope.
func FuzzDecodeEnvelope(f *testing.F) {
	c := &Codec{}
	for _, env := range validFrames() {
		b, err := c.Encode(env)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x08, 0x02})
	f.Fuzz(func(t *testing.T, frame []byte) {
		env, err := c.Decode(frame)
		if err != nil {
			if _, ok := RejectReasonOf(err); !ok {
				t.Fatalf("error without a reject reason: %v", err)
			}
			return
		}
		if _, ok := FrameTypeOf(env); !ok {
			t.Fatal("accepted an envelope without a body")
		}
		b, err := c.Encode(env)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := c.Decode(b)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		env.Mac = nil // NoAuth seals nothing: a received MAC is not sent on
		if !proto.Equal(env, again) {
			t.Fatal("round trip changed the envelope")
		}
	})
}
