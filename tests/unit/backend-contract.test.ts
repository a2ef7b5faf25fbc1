import { backendContract } from '../support/backend-contract.ts';
import { FakeBackend } from '../support/fake-backend.ts';

backendContract('the in-process fake', async () => ({
  backend: new FakeBackend(['kiln-sandbox:fake']),
  image: 'kiln-sandbox:fake',
}));
