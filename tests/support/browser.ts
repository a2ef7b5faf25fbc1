/**
 * Debian's chromium as infra/test.sh installs it, headless, with what reaches the network off
 * (this machine's network is closed: background connections would only be refused).
 */
export const CHROMIUM = {
  executablePath: '/usr/bin/chromium',
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
};
