// Parses the runner's large frames (see frames.ts) in their own thread, so a sandbox's tens of
// megabytes of JSON never hold the API's event loop.
//   in:  { id, body: Uint8Array }    out: { id, ok: object } | { id, error }
import { serve } from '../lib/serve-thread.mjs';

const utf8 = new TextDecoder();

serve((msg) => JSON.parse(utf8.decode(msg.body)));
