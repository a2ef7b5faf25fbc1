import { describe, expect, it } from 'vitest';
import { parseToolCall, parseXml, toolsFor } from '../../apps/api/src/agent/protocol.ts';
import { approvalText, fromApprovalText } from '../../apps/api/src/agent/source-update.ts';
import { DEFAULT_SETTINGS } from '../../apps/api/src/workspace/settings.ts';

const PATCH =
  'diff --git a/x.ts b/x.ts\n--- a/x.ts\n+++ b/x.ts\n@@ -1 +1 @@\n-<python>old</python>\n+<finish>new</finish>\n';

describe('propose_source_update in both protocols', () => {
  it('XML: the proposal wins over tags inside its patch; a diff fence is taken off; the patch ends with a newline', () => {
    const reply = `<thinking>the parser needs a fix</thinking>\n<propose_source_update><reason>Fix the parser</reason><patch>\n\`\`\`diff\n${PATCH}\`\`\`\n</patch></propose_source_update>`;
    expect(parseXml(reply)).toEqual({
      thinking: 'the parser needs a fix',
      action: { type: 'source_update', reason: 'Fix the parser', patch: PATCH },
    });
    expect(parseXml('<propose_source_update><reason>r</reason></propose_source_update>').action).toEqual({
      type: 'source_update',
      reason: 'r',
      patch: '',
    });
    expect(parseXml('<python>1</python>').action).toEqual({ type: 'python', code: '1' });
  });

  it('tools: offered only where enabled, parsed with its call id', () => {
    const names = (s: typeof DEFAULT_SETTINGS) => toolsFor(s).map((t) => ('function' in t ? t.function.name : t.type));
    expect(names(DEFAULT_SETTINGS)).not.toContain('propose_source_update');
    expect(names({ ...DEFAULT_SETTINGS, source_updates: true })).toContain('propose_source_update');
    const parsed = parseToolCall({
      id: 'call_1',
      name: 'propose_source_update',
      arguments: JSON.stringify({ reason: 'why', patch: PATCH }),
    });
    expect(parsed).toEqual({ action: { type: 'source_update', reason: 'why', patch: PATCH }, toolCallId: 'call_1' });
  });

  it('the approval shows reason and patch, and gives back exactly the patch that was proposed', () => {
    const text = approvalText('Fix\nthe   parser', PATCH);
    expect(text).toContain('Reason: Fix the parser\n\ndiff --git');
    expect(fromApprovalText(text)).toEqual({ reason: 'Fix the parser', patch: PATCH });
  });
});
