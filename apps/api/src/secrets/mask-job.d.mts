type Secret = { name: string; value: string };
export function maskTexts(secrets: Secret[], texts: string[]): string[];
export function maskFiles(secrets: Secret[], files: string[]): string[];
