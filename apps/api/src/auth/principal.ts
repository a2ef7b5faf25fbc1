/** Who is calling: the API key behind a request, its role and team. */
export interface Principal {
  keyId: string;
  role: 'org_admin' | 'owner' | 'admin' | 'member' | 'viewer';
  /** null for org-admin keys */
  teamId: string | null;
  canApprove: boolean;
}
