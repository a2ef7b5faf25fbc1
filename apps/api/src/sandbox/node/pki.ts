import { randomBytes, webcrypto, X509Certificate } from 'node:crypto';
import { isIP } from 'node:net';
// @peculiar/x509 resolves its parts through tsyringe, which needs the Reflect metadata API first.
import 'reflect-metadata';
import * as x509 from '@peculiar/x509';

/**
 * The installation's own certificate authority for the channel between API replicas and sandbox
 * nodes (mutual TLS both ways). Each certificate says what it is in its common name: a node
 * `kiln-node:<name>`, an API replica `kiln-api:<name>`. A node serves only peers whose chain ends
 * at this CA and whose name says API; a replica talks only to a node whose certificate names the
 * node it dialled. So a node's certificate cannot act as an API, an API's cannot act as a node,
 * and a certificate from any other CA is refused at the handshake.
 */
const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const crypto = webcrypto as unknown as Crypto;
x509.cryptoProvider.set(crypto);

export type PeerRole = 'node' | 'api';
const PREFIX: Record<PeerRole, string> = { node: 'kiln-node:', api: 'kiln-api:' };
/** A node's or replica's name: what its certificate carries and the registry knows it by. */
export const PEER_NAME = /^[a-z0-9][a-z0-9.-]{0,62}$/;

/** PEM texts: a certificate and its private key. */
export interface KeyPair {
  cert: string;
  key: string;
}

/** What a node or a replica is given: its own certificate and key, and the CA to check the other side with. */
export interface PeerCredentials extends KeyPair {
  ca: string;
}

const pem = (label: string, der: ArrayBuffer) =>
  `-----BEGIN ${label}-----\n${Buffer.from(der)
    .toString('base64')
    .replace(/(.{64})/g, '$1\n')
    .replace(/\n$/, '')}\n-----END ${label}-----\n`;

const serial = () => `01${randomBytes(15).toString('hex')}`;
const years = (n: number) => new Date(Date.now() + n * 365 * 24 * 3600 * 1000);

async function keyPem(key: CryptoKey): Promise<string> {
  return pem('PRIVATE KEY', await crypto.subtle.exportKey('pkcs8', key));
}

function importKey(text: string): Promise<CryptoKey> {
  const der = Buffer.from(text.replace(/-----[^-]+-----/g, '').replace(/\s+/g, ''), 'base64');
  return crypto.subtle.importKey('pkcs8', der, ALG, true, ['sign']);
}

/** A new certificate authority for one installation (valid ten years). */
export async function makeAuthority(installation = 'kiln'): Promise<KeyPair> {
  const keys = (await crypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as CryptoKeyPair;
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: `CN=Kiln CA ${installation}`,
    notBefore: new Date(Date.now() - 60_000),
    notAfter: years(10),
    signingAlgorithm: ALG,
    keys,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { cert: cert.toString('pem'), key: await keyPem(keys.privateKey) };
}

/**
 * A certificate for a node or an API replica, signed by `authority` (valid one year). A node's
 * carries the addresses and host names it is dialled at, which the replica checks as TLS does.
 */
export async function issue(
  authority: KeyPair,
  o: { role: PeerRole; name: string; hosts?: string[] },
): Promise<PeerCredentials> {
  if (!PEER_NAME.test(o.name)) throw new Error(`a ${o.role} name is lower-case letters, digits, dots and dashes`);
  const ca = new x509.X509Certificate(authority.cert);
  const keys = (await crypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as CryptoKeyPair;
  const hosts = o.hosts ?? [];
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject: `CN=${PREFIX[o.role]}${o.name}`,
    issuer: ca.subject,
    notBefore: new Date(Date.now() - 60_000),
    notAfter: years(1),
    signingAlgorithm: ALG,
    publicKey: keys.publicKey,
    signingKey: await importKey(authority.key),
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([
        o.role === 'node' ? x509.ExtendedKeyUsage.serverAuth : x509.ExtendedKeyUsage.clientAuth,
      ]),
      ...(hosts.length
        ? [
            new x509.SubjectAlternativeNameExtension(
              hosts.map((h) => (isIP(h) ? { type: 'ip' as const, value: h } : { type: 'dns' as const, value: h })),
            ),
          ]
        : []),
      await x509.AuthorityKeyIdentifierExtension.create(ca),
    ],
  });
  return { cert: cert.toString('pem'), key: await keyPem(keys.privateKey), ca: authority.cert };
}

/**
 * The name a peer's certificate gives for `role` (already verified against the CA by the TLS
 * handshake), or null when it names another role or nothing.
 */
export function peerName(raw: Buffer | undefined, role: PeerRole): string | null {
  if (!raw?.length) return null;
  const subject = new X509Certificate(raw).subject;
  const cn = /^CN=(.*)$/m.exec(subject)?.[1] ?? '';
  if (!cn.startsWith(PREFIX[role])) return null;
  const name = cn.slice(PREFIX[role].length);
  return PEER_NAME.test(name) ? name : null;
}
