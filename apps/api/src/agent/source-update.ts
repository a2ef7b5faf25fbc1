import type { ChatCompletionTool } from 'openai/resources/chat/completions';

/**
 * The agent's way into platform self-update: a workspace an org admin has enabled
 * (`settings.source_updates`) may propose a patch to Kiln's own source. The proposal always
 * waits for an org admin's approval, whatever the workspace's approval mode; once approved it is
 * submitted like an admin's own patch (self-check first; applying stays a separate admin step).
 */
export interface SourceUpdateSink {
  submit(
    input: { patch: string; reason: string; author: 'agent' },
    actor: undefined,
  ): Promise<{ id: string; status: string }>;
}

export const SOURCE_UPDATE_TOOL: ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'propose_source_update',
    description:
      'Propose a change to the Kiln platform source itself (a unified diff). An org admin must approve it; it is then self-checked (type-check, smoke tests, boot) before anyone can apply it.',
    parameters: {
      type: 'object',
      properties: {
        reason: { type: 'string', description: 'Why, in a sentence' },
        patch: { type: 'string', description: 'git diff of the platform source' },
      },
      required: ['reason', 'patch'],
    },
  },
};

export const SOURCE_UPDATE_XML =
  '<propose_source_update><reason>why, in a sentence</reason><patch>a unified diff (git diff) of the Kiln platform source</patch></propose_source_update> ' +
  'proposes a change to the platform itself: an org admin must approve it, then it is self-checked and applied separately.';

const PREFIX = 'Platform source update proposed by the agent.\nReason: ';

/** What the approval shows the admin (and stores): the reason, then the patch exactly as proposed. */
export const approvalText = (reason: string, patch: string) =>
  `${PREFIX}${reason.replace(/\s+/g, ' ').trim()}\n\n${patch}`;

export function fromApprovalText(text: string): { reason: string; patch: string } {
  const body = text.slice(PREFIX.length);
  const cut = body.indexOf('\n\n');
  return { reason: body.slice(0, cut), patch: body.slice(cut + 2) };
}

const SOURCE_UPDATE_DISABLED =
  'Kiln System: [Source update refused] This workspace may not propose platform source updates (an org admin enables them per workspace). Nothing was submitted.';

const SOURCE_UPDATE_INCOMPLETE =
  'Kiln System: [Source update refused] A proposal needs a non-empty reason and patch. Nothing was submitted.';

const sourceUpdateSubmitted = (u: { id: string; status: string }) =>
  `Kiln System: [Source update submitted] An org admin approved your proposal. It is update ${u.id}, status ${u.status}: the self-check ` +
  '(type-check, smoke tests, boot on a spare port) runs now; applying it and restarting the platform is a separate step an org admin takes.';

const sourceUpdateFailed = (message: string) =>
  `Kiln System: [Source update refused] The approved patch could not be submitted: ${message}`;

/**
 * Why a proposal cannot go to an org admin (the workspace does not allow source updates, the
 * server has no sink, or the proposal is incomplete); null when it may.
 */
export function proposalRefusal(
  allowed: boolean,
  sink: SourceUpdateSink | undefined,
  action: { patch: string; reason: string },
): string | null {
  if (!allowed || !sink) return SOURCE_UPDATE_DISABLED;
  if (!action.patch || !action.reason.trim()) return SOURCE_UPDATE_INCOMPLETE;
  return null;
}

/** What the model is told once an org admin approved a proposal: it was submitted (or why not). */
export async function submitApproved(sink: SourceUpdateSink | undefined, approvalCode: string): Promise<string> {
  if (!sink) return SOURCE_UPDATE_DISABLED;
  const proposal = fromApprovalText(approvalCode);
  return sink
    .submit({ ...proposal, author: 'agent' }, undefined)
    .then(sourceUpdateSubmitted, (err: Error) => sourceUpdateFailed(err.message));
}
