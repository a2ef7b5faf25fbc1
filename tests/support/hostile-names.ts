/** Names git's own path rules (verify_path with core.protectNTFS/protectHFS) refuse, and neighbours of them it accepts. */
export const HOSTILE_NAMES = [
  '.git.', '.git ', '.git. . ', '.GIT', '.Git', 'git~1', 'GIT~1', 'Git~1 ', '.git::$INDEX_ALLOCATION', '.git:stream',
  '.g\u200cit', '.gi\u200dt', '\u200c.git', '.git\ufeff', '.\u202egit',
  '.gitattributes', '.gitignore', '.gitmodules', '.GITIGNORE', '.gitmodules.', '.gitattributes::$DATA', 'gitmod~1', 'gi7eba~1', 'gitign~3', 'gi250a~1', 'gitatt~2', 'gi7d29~1',
  '.kiln-0123456789ab.tmp', 'line\nbreak', 'tab\there', 'bell\u0007', 'del\u007f', 'x'.repeat(256),
  // Accepted by both: git commits them like any other name.
  '.git~1', 'git~2', 'git', '.gitfoo', '.github', '.mailmap', ' leading space', 'trailing.', 'trailing ', '-rf', '*', '[ab]', ':(exclude)x', ':', ':(top)', '~', 'CON', 'aux.txt', 'ünïcödé', '\u200cgit', 'x'.repeat(255),
];
