// One result's masking, the same on the event loop and in mask.worker.mjs (types: mask-job.d.mts).
import { Masker, patternsOf } from './masker.mjs';

export function maskTexts(secrets, texts) {
  const m = new Masker(patternsOf(secrets));
  return texts.map((t) => m.mask(t));
}

/** File contents (base64) masked as bytes: a file keeps every byte that is not a secret's. */
export function maskFiles(secrets, files) {
  if (files.length === 0) return [];
  const m = new Masker(patternsOf(secrets, { bytes: true }));
  return files.map((b64) => {
    const raw = Buffer.from(b64, 'base64').toString('latin1');
    const masked = m.mask(raw);
    return masked === raw ? b64 : Buffer.from(masked, 'latin1').toString('base64');
  });
}
