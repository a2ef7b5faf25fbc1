// Masks a large execution result (see masking.ts) in its own thread, so tens of megabytes of a
// sandbox's output never hold the API's event loop.
//   in:  { id, secrets: { name, value }[], texts: string[], files: string[] (base64) }
//   out: { id, ok: { texts: string[], files: string[] } }
import { serve } from '../lib/serve-thread.mjs';
import { maskFiles, maskTexts } from './mask-job.mjs';

serve(({ secrets, texts, files }) => ({ texts: maskTexts(secrets, texts), files: maskFiles(secrets, files) }));
