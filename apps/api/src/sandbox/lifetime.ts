/** When a sandbox goes: at its idle deadline, or at its container's hard lifetime if that comes first. */
export function reclaimAt(idleUntil: number, hardExpiry: number | undefined): Date {
  return new Date(hardExpiry === undefined ? idleUntil : Math.min(idleUntil, hardExpiry));
}
