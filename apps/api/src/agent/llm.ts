import OpenAI from 'openai';
import type { ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions';
import type { KilnMetrics } from '../metrics/metrics.ts';

export type ChatMessage = ChatCompletionMessageParam;

export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

export interface ModelTurn {
  content: string;
  toolCalls: ToolCall[];
  usage: { promptTokens: number; completionTokens: number };
}

/** Why a model call failed, in the terms the run reports. */
export class ModelError extends Error {
  constructor(
    readonly code: 'model_unavailable' | 'context_overflow' | 'model_not_configured' | 'cancelled',
    message: string,
    /** For context_overflow: the limit the endpoint named, when it did. */
    readonly limit?: number,
  ) {
    super(message);
  }
}

export interface ModelClientOptions {
  baseURL?: string;
  apiKey?: string;
  defaultModel?: string;
  /** Retries on 429 and 5xx, with the SDK's exponential backoff. */
  maxRetries: number;
  timeoutMs: number;
  /** Where each call's duration and tokens are counted (the app's metrics). */
  metrics?: Pick<KilnMetrics, 'modelCall'>;
}

/** Any OpenAI-compatible chat endpoint, always streamed (so a cancel stops it mid-answer). */
export class ModelClient {
  private readonly client: OpenAI | undefined;

  constructor(readonly opts: ModelClientOptions) {
    this.client =
      opts.baseURL || opts.apiKey
        ? new OpenAI({
            baseURL: opts.baseURL,
            apiKey: opts.apiKey ?? 'unused',
            maxRetries: opts.maxRetries,
            timeout: opts.timeoutMs,
          })
        : undefined;
  }

  /** Whether the server has a model endpoint at all (OPENAI_BASE_URL or OPENAI_API_KEY). */
  get hasEndpoint(): boolean {
    return this.client !== undefined;
  }

  /** The model a workspace will use, or null when none is configured anywhere. */
  modelFor(workspaceModel: string | null): string | null {
    if (!this.client) return null;
    return workspaceModel ?? this.opts.defaultModel ?? null;
  }

  async complete(req: {
    model: string;
    messages: ChatMessage[];
    tools?: ChatCompletionTool[];
    signal?: AbortSignal;
  }): Promise<ModelTurn> {
    if (!this.client)
      throw new ModelError(
        'model_not_configured',
        'no model endpoint is configured: set OPENAI_BASE_URL / OPENAI_API_KEY and KILN_MODEL',
      );
    const started = performance.now();
    try {
      const stream = await this.client.chat.completions.create(
        {
          model: req.model,
          messages: req.messages,
          tools: req.tools,
          stream: true,
          stream_options: { include_usage: true },
        },
        { signal: req.signal },
      );
      let content = '';
      const calls: ToolCall[] = [];
      let usage = { promptTokens: 0, completionTokens: 0 };
      for await (const chunk of stream) {
        if (chunk.usage)
          usage = { promptTokens: chunk.usage.prompt_tokens, completionTokens: chunk.usage.completion_tokens };
        const delta = chunk.choices[0]?.delta;
        if (!delta) continue;
        if (delta.content) content += delta.content;
        for (const tc of delta.tool_calls ?? []) {
          const call = (calls[tc.index] ??= { id: '', name: '', arguments: '' });
          if (tc.id) call.id = tc.id;
          if (tc.function?.name) call.name += tc.function.name;
          if (tc.function?.arguments) call.arguments += tc.function.arguments;
        }
      }
      this.opts.metrics?.modelCall(req.model, performance.now() - started, { usage });
      return { content, toolCalls: calls.filter(Boolean), usage };
    } catch (err) {
      const e = toModelError(err, req.signal);
      this.opts.metrics?.modelCall(req.model, performance.now() - started, { error: e.code });
      throw e;
    }
  }
}

function toModelError(err: unknown, signal?: AbortSignal): ModelError {
  if (err instanceof ModelError) return err;
  if (signal?.aborted || err instanceof OpenAI.APIUserAbortError)
    return new ModelError('cancelled', 'the model call was cancelled');
  if (err instanceof OpenAI.APIError) {
    const text = `${err.message} ${JSON.stringify(err.error ?? {})}`;
    if (
      err.status === 400 &&
      /context_length_exceeded|maximum context length|context window|too many tokens/i.test(text)
    ) {
      const limit = /maximum context length is (\d+)/i.exec(text)?.[1] ?? /(\d{3,})\s*tokens/i.exec(text)?.[1];
      return new ModelError('context_overflow', err.message, limit ? Number(limit) : undefined);
    }
    return new ModelError(
      'model_unavailable',
      `the model endpoint answered ${err.status ?? 'with an error'}: ${err.message}`,
    );
  }
  return new ModelError('model_unavailable', `the model endpoint could not be reached: ${(err as Error).message}`);
}
