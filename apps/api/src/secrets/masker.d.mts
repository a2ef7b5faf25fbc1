export interface MaskPattern {
  name: string;
  text: string;
}

export function patternsOf(secrets: { name: string; value: string }[], opts?: { bytes?: boolean }): MaskPattern[];

export interface MaskStream {
  /** What of the input so far is safe to pass on now, masked; the rest is held. */
  push(chunk: string): string;
  /** Everything still held, masked: the stream is over. */
  end(): string;
}

export class Masker {
  constructor(patterns: MaskPattern[]);
  readonly empty: boolean;
  /** The longest pattern, in UTF-16 code units. */
  readonly longest: number;
  /** Trie moves made while masking so far (forward and along fail links): at most two per input unit. */
  readonly moves: number;
  mask(text: string): string;
  stream(): MaskStream;
}
